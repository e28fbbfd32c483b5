"""Tiny text plots: probability bars and per-step sparklines; text made safe to draw
(pure functions)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from rich.cells import cell_len, set_cell_size

from loopchat.token_faces import byte_face, partial_character

#: control characters a terminal would obey (ESC starts a colour, a cursor move...):
#: C0 but tab and line feed, DEL, C1
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _picture(m: re.Match) -> str:
    c = ord(m.group())
    return chr(0x2400 + c) if c < 0x20 else "\u2421" if c == 0x7F else "\ufffd"


def visible_controls(text: str) -> str:
    """`text` with each control character drawn as a visible symbol (ESC as ␛, U+241B:
    Unicode's control pictures; DEL ␡; C1 �), never sent to the terminal raw. What is
    stored and sent to the model keeps the real characters."""
    return _CONTROLS.sub(_picture, text) if _CONTROLS.search(text) else text


_EIGHTHS = " ▏▎▍▌▋▊▉"
_SPARK = "▁▂▃▄▅▆▇█"


def bar(fraction: float, width: int) -> str:
    """A left-aligned horizontal bar `width` cells wide, filled to `fraction` (0..1)."""
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    s = "█" * full + (_EIGHTHS[part] if part and full < width else "")
    return s.ljust(width)


def sparkline(values: list[float | None], width: int) -> str:
    """Values squeezed into `width` cells (each cell the max of its bucket), scaled from
    their min to their max. None is a value not given: a blank cell (a bucket with no
    value given); an infinite value is a full cell and is left out of the scale."""
    if not values or width <= 0:
        return ""
    known = [v for v in values if v is not None]
    gaps = len(known) < len(values)
    if len(values) > width:
        buckets: list[float | None] = []
        n = len(values)
        for i in range(width):
            lo, hi = i * n // width, max(i * n // width + 1, (i + 1) * n // width)
            if not gaps:  # known is values
                buckets.append(max(known[lo:hi]))
                continue
            given = [v for v in values[lo:hi] if v is not None]
            buckets.append(max(given) if given else None)
        values = buckets
        known = [v for v in values if v is not None]
    finite = [v for v in known if v != math.inf] if math.inf in known else known
    return _scaled(values, min(finite, default=0.0), max(finite, default=0.0))


def _scaled(values: Sequence[float | None], lo: float, top: float) -> str:
    """One cell per value on the scale lo..top: None a blank cell, an infinite value a full
    one; a scale with nothing to show (top <= 0) or flat (within 5% of top) a low line
    rather than noise."""
    span = top - lo
    flat = top <= 0 or span <= top * 0.05

    def cell(v: float | None) -> str:
        if v is None:
            return " "
        if v == math.inf:
            return _SPARK[7]
        if top <= 0:
            return _SPARK[0]
        if flat:
            return _SPARK[1]
        return _SPARK[min(7, int((v - lo) / span * 7.999))]

    return "".join(cell(v) for v in values)


def fmt_bits_range(lo: float, hi: float) -> str:
    """A range of bits, two decimals ("0.00–6.24 bits"; ∞ for a probability of 0)."""
    return f"{_bits(lo)}–{_bits(hi)} bits"


def _bits(b: float) -> str:
    return "∞" if b == math.inf else f"{b:.2f}"


def sparklines_same_scale(series: list[list[float]], width: int) -> list[str]:
    """Sparklines that compare: one scale (the lowest to the highest value of all the
    series) and one number of values per cell, so each line's length is in proportion to
    its count of values (the longest fills `width`; a cell shows its bucket's max)."""
    lines: list[list[float]] = [list(v) for v in series]
    longest = max((len(v) for v in lines), default=0)
    if longest == 0 or width <= 0:
        return ["" for _ in lines]
    per_cell = -(-longest // width)  # ceil
    cells = [[max(v[i : i + per_cell]) for i in range(0, len(v), per_cell)] for v in lines]
    lo, top = min(min(v) for v in lines if v), max(max(v) for v in lines if v)
    return [_scaled(c, lo, top) for c in cells]


def fmt_ms(ms: float) -> str:
    if ms >= 10_000:
        return f"{ms / 1000:.1f} s"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    if ms >= 100:
        return f"{ms:.0f} ms"
    return f"{ms:.1f} ms"


def fmt_tokens(n: int) -> str:
    """A count of tokens: "1 token", "21 tokens"."""
    return "1 token" if n == 1 else f"{n:,} tokens"


def fmt_rate(tokens_per_s: float) -> str:
    """A decode rate: whole numbers from 10 tok/s up, one decimal below (0.3, not 0)."""
    return f"{tokens_per_s:.0f} tok/s" if tokens_per_s >= 9.95 else f"{tokens_per_s:.1f} tok/s"


def fmt_ms_range(lo: float, hi: float) -> str:
    """A range of times in one unit, the larger end's ("12.1–35.7 ms", "0.95–3.57 s")."""
    if hi >= 1000:
        digits = 1 if hi >= 10_000 else 2
        return f"{lo / 1000:.{digits}f}–{hi / 1000:.{digits}f} s"
    digits = 0 if hi >= 100 else 1
    return f"{lo:.{digits}f}–{hi:.{digits}f} ms"


def fmt_prob(p: float) -> str:
    if p >= 0.9995:
        return "100%"
    if p >= 0.0995:
        return f"{p * 100:.1f}%"
    if p >= 0.001:
        return f"{p * 100:.2f}%"
    if p <= 0:
        return "0%"
    return "<0.1%"


def token_face(text: str, raw: bytes | None = None) -> str:
    """show_token, but a token whose bytes are a piece of a character by those bytes,
    `<e2 82>` (its text is U+FFFD, the same for every piece)."""
    return byte_face(raw) if raw is not None and partial_character(raw) else show_token(text)


def listed_face(text: str) -> str:
    """A vocabulary entry made visible (the engine lists a piece of a character as its
    bytes already, `<e2 82>`: kept as it is)."""
    return text if _BYTE_FACE.fullmatch(text) else show_token(text)


_BYTE_FACE = re.compile(r"<[0-9a-f]{2}(?: [0-9a-f]{2})*>")


def show_token(text: str) -> str:
    """A token made visible: leading/trailing spaces as ␣, newlines as ⏎, tabs as ⇥, other
    control characters as their pictures (visible_controls)."""
    if text == "":
        return "∅"
    return visible_controls(text.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥").replace("\r", "␍"))


def cell(s: str, width: int, right: bool = False) -> str:
    """`s` in exactly `width` cells: padded, or cut with an ellipsis (like a table cell)."""
    n = len(s) if s.isascii() else cell_len(s)
    if n > width:
        return set_cell_size(s, width - 1) + "…" if width > 0 else ""
    pad = " " * (width - n)
    return pad + s if right else s + pad
