"""One wire event's text (an SSE `data:` line or a whole response body) as styled screen
rows for the wire view: the framing dimmed, the keys muted, the reply's text
(`delta.content`, `message.content`, a completion's `text`) and `finish_reason`
highlighted, and, when folded, the long nested values (the `loopchat` extension, each
token's `top_logprobs`) replaced by their size in bytes. Rows are cut at the view's
width, character by character (JSON has few spaces to wrap at).

The text itself is never changed: what is folded is said, with its exact size, and
every other character is shown as it is (control characters as their Unicode
pictures, a line break as a new row). No Textual here, only rich styles.
"""

from __future__ import annotations

import re

from rich.cells import get_character_cell_size
from rich.style import Style

from loopchat.wire import EXTENSION_KEY

#: One screen row: (text, style) pieces (the same shape as fast_static.Line).
Row = tuple[tuple[str, Style], ...]

FRAMING = Style.parse("#6c6c6c")  # `data: `, the annotation rows
KEY = Style.parse("#87afd7")
VALUE = Style.parse("#d7d7af")
PUNCT = Style.parse("#808080")
CONTENT = Style.parse("bold #ffaf00")  # the reply's text: the panel's "drawn" colour
FINISH = Style.parse("bold #ff87d7")
EXTENSION = Style.parse("#6c8aa8")  # loopchat's own fields, unfolded
FOLDED = Style.parse("italic #8a8a8a")
DONE = Style.parse("bold #87d7ff")
NOTE = Style.parse("italic #6c6c6c")

#: Keys whose (object or array) value is folded into its size.
FOLD_KEYS = frozenset({EXTENSION_KEY, "top_logprobs"})
#: Keys whose string value is the reply's text.
CONTENT_KEYS = frozenset({"content", "text"})

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]|-?\d[\d.eE+-]*|true|false|null')
_NESTING = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')  # strings (skipped whole) and brackets
_COLON = re.compile(r"\s*:\s*")
_DATA = "data:"
_CONTROL = {c: 0x2400 + c for c in range(0x20) if c != 0x0A}
_CONTROL[0x7F] = 0x2421


def _nbytes(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


def styled(text: str, fold: bool) -> list[tuple[str, Style]]:
    """`text` as (piece, style) pieces, left to right; with `fold`, the values of
    FOLD_KEYS replaced by `{… N B}` / `[… N B]` (N: their exact size in UTF-8 bytes)."""
    text = text.translate(_CONTROL)
    out: list[tuple[str, Style]] = []
    pos = 0
    if text.startswith(_DATA):
        prefix = _DATA + (" " if text[len(_DATA) : len(_DATA) + 1] == " " else "")
        out.append((prefix, FRAMING))
        pos = len(prefix)
        if text[pos:].strip() == "[DONE]":
            out.append((text[pos:], DONE))
            return out
    elif text.startswith(":"):  # an SSE comment (a keep-alive): not data
        return [(text, FRAMING)]

    def emit(end: int, style: Style) -> None:
        nonlocal pos
        if end > pos:
            out.append((text[pos:end], style))
            pos = end

    value_key: str | None = None  # the key whose value starts at value_at
    value_at = -1
    search = _TOKEN.search
    at = 0
    while (m := search(text, at)) is not None:
        start, end = m.span()
        at = end
        tok = m.group()
        key = value_key if start == value_at else None
        value_key, value_at = None, -1
        first = tok[0]
        if first == '"':
            colon = _COLON.match(text, end) if key is None else None
            if colon is not None:  # a key
                emit(start, PUNCT)
                emit(end, KEY)
                value_key, value_at = tok[1:-1], colon.end()
            else:
                emit(start, PUNCT)
                emit(end, CONTENT if key in CONTENT_KEYS else FINISH if key == "finish_reason" else VALUE)
        elif first in "[{":
            if key in FOLD_KEYS or key == EXTENSION_KEY:
                close = _matching(text, start)
                if close is not None and (fold or key == EXTENSION_KEY):
                    emit(start, PUNCT)
                    if fold:
                        size = _nbytes(text[start:close])
                        out.append((f"{tok}… {size:,} B{']' if tok == '[' else '}'}", FOLDED))
                        pos = close
                    else:  # loopchat's own fields, whole: dimmed as one piece
                        emit(close, EXTENSION)
                    at = close
        elif first not in "]}":  # a number, true, false, null
            emit(start, PUNCT)
            emit(end, VALUE)
    emit(len(text), PUNCT)
    return out


def _matching(text: str, open_at: int) -> int | None:
    """The index just past the bracket that closes the one at `open_at` (None: unclosed)."""
    depth = 0
    for m in _NESTING.finditer(text, open_at):
        tok = m.group()
        if tok in "[{":
            depth += 1
        elif tok in "]}":
            depth -= 1
            if depth == 0:
                return m.end()
    return None


def to_rows(pieces: list[tuple[str, Style]], width: int) -> list[Row]:
    """The pieces cut into rows of at most `width` cells: after a comma when one is
    near the row's end (not the one in a folded value's size), else where the row is
    full (a line break starts a row; a wide character that does not fit moves to the
    next row)."""
    # a folded value's size ("{… 1,428 B}") is no place to break: its comma is masked
    text = "".join(s.replace(",", "_") if style is FOLDED else s for s, style in pieces)
    rows: list[Row] = []
    i = 0  # the piece holding text[at]
    at = 0  # where that piece starts in text
    for a, b in _ranges(text, max(1, width)):
        while i < len(pieces) and at + len(pieces[i][0]) <= a:
            at += len(pieces[i][0])
            i += 1
        row: list[tuple[str, Style]] = []
        j, pos = i, at
        while j < len(pieces) and pos < b:
            s, style = pieces[j]
            lo, hi = max(a, pos), min(b, pos + len(s))
            if hi > lo:
                row.append((s[lo - pos : hi - pos], style))
            pos += len(s)
            j += 1
        rows.append(tuple(row))
    return rows


def _ranges(text: str, width: int) -> list[tuple[int, int]]:
    """(start, end) of each row's characters in `text` (line breaks left out)."""
    back = max(1, min(16, width // 3))  # how far back a comma may end a row
    out: list[tuple[int, int]] = []
    off = 0
    for line in text.split("\n"):
        n = len(line)
        pos = 0
        if line.isascii():
            while n - pos > width:
                end = pos + width
                comma = line.rfind(",", end - back, end)
                if comma >= pos:
                    end = comma + 2 if line[comma + 1 : comma + 2] == " " and comma + 2 <= end else comma + 1
                out.append((off + pos, off + end))
                pos = end
        else:
            cells = 0
            comma = -1
            for k, ch in enumerate(line):
                w = get_character_cell_size(ch)
                if cells + w > width and k > pos:
                    end = comma + 1 if comma >= pos and k - comma <= back else k
                    out.append((off + pos, off + end))
                    cells = sum(get_character_cell_size(c) for c in line[end:k])
                    pos = end
                cells += w
                if ch == ",":
                    comma = k
        out.append((off + pos, off + n))
        off += n + 1
    return out


def event_rows(text: str, width: int, fold: bool) -> list[Row]:
    """One wire event's text as screen rows."""
    return to_rows(styled(text, fold), width)
