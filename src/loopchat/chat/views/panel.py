"""The loop panel: one forward pass's record (candidates, timings, settings), drawn once
per frame from the latest Step event, or from a past step the user selected.

A reply from a remote server shows what the wire gave: the server's log-probabilities,
the arrival gaps between chunks (labelled so: not forward passes), and "not given" for
every figure the server does not send (Step fields that are None). A loopchat server
sends its engine's own record: its panel is as complete as a local one.

Drawn cheaply: every line is a `rich.text.Text` built with fixed-width formatting (no
rich Table or Group per frame), the lines are shown by a `FastStatic` (repaints only the
lines that changed, without a screen re-layout) and nothing is rebuilt when the view has
not changed since the last frame.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.widget import Widget

from loopchat.chat.conversation import BLOCKING, ReplyRecord, finish_label
from loopchat.chat.plots import (
    bar,
    cell,
    fmt_bits_range,
    fmt_ms,
    fmt_ms_range,
    fmt_prob,
    fmt_rate,
    sparkline,
    token_face,
)
from loopchat.events import Candidate, Pending, Prefill, Step
from loopchat.settings import KNOBS, SETTING, SamplingSettings, fmt_dry, fmt_value
from loopchat.tui.fast_static import FastStatic, Line, lines_to_text, text_to_lines
from loopchat.tui.panel_caches import PanelCaches, ReplyIndex, Series
from loopchat.tui.repeat_view import repeat_lines

HEAD = Style.parse("bold #87d7ff")
LABEL = Style.parse("#8a8a8a")
DRAWN = Style.parse("bold #ffaf00")
CHANGED = Style.parse("bold #ff87d7")
_GENERATING = Style.parse("#5fd75f")
_BLOCKING = Style.parse("italic #87afd7")
_TOKEN = Style.parse("#d0d0d0")
_RAW_BAR = Style.parse("#5f87af")
_SAMPLED_BAR = Style.parse("#5faf5f")
_SPARK = Style.parse("#5fafd7")
_UNSURE = Style.parse("#d7af5f")
_PENDING = Style.parse("#ffd75f")
_WELCOME = Style.parse("#bcbcbc")
_DIM = Style.parse("dim")
_BOLD = Style.parse("bold")
_NONE = Style()
NOT_GIVEN = "not given"

_WELCOME_TEXT = (
    "Each reply is made one token at a time: the model runs a forward pass over the "
    "context, gets a probability for every token of its vocabulary, and the sampler "
    "draws one. Send a message to watch it happen."
)


@dataclass
class PanelView:
    record: ReplyRecord | None
    step: Step | None
    live: SamplingSettings  # what the next step will use
    knob: str = "temperature"
    pinned: bool = False  # a past token selected by the user
    generating: bool = False
    compact: bool = False
    width: int = 48
    height: int = 0  # lines the panel has (0: as many as it needs)
    model: str = ""
    takes_messages: bool = True  # False for a replayed trace: there is no next reply
    #: step mode: the die of the draw the loop is stopped before (shown unless a token is pinned)
    pending: Pending | None = None


# ------------------------------------------------------------- helpers ----
def _width_of(pieces: list[tuple[str, Style]]) -> int:
    n = 0
    for s, _ in pieces:
        n += len(s) if s.isascii() else cell_len(s)
    return n


def _to_text(pieces: list[tuple[str, Style]], no_wrap: bool = False) -> Text:
    t = Text(no_wrap=no_wrap, overflow="ellipsis")
    for s, style in pieces:
        t.append(s, style)
    return t


def _fit(pieces: list[tuple[str, Style]], width: int, out: list[Line], no_wrap: bool = False) -> None:
    """Append one logical line to `out` as screen lines: word-wrapped (or cut with an
    ellipsis, if no_wrap) exactly as rich would print it."""
    if _width_of(pieces) <= width:
        out.append(tuple(pieces))
    else:
        out.extend(text_to_lines(_to_text(pieces, no_wrap), width))


def _fit_all(lines: list[list[tuple[str, Style]]], width: int, out: list[Line], no_wrap: bool = False) -> None:
    for pieces in lines:
        _fit(pieces, width, out, no_wrap)


def _rstrip(pieces: list[tuple[str, Style]]) -> None:
    while pieces:
        s, style = pieces[-1]
        s = s.rstrip()
        if s:
            pieces[-1] = (s, style)
            return
        pieces.pop()


def _is_drawn(c: Candidate, s: Step) -> bool:
    """Whether candidate `c` is the token step `s` drew (a server that sends no token ids:
    the same text with the same probability)."""
    if s.token_id is not None:
        return c.token_id == s.token_id
    return c.text == s.piece and c.prob == s.raw_prob


def _remote(v: PanelView) -> str:
    """The server that generated the reply shown ("" for this machine's engine)."""
    r = v.record
    return r.start.source if r is not None and r.start is not None else ""


# ------------------------------------------------------------- sections ----
Pieces = list[tuple[str, Style]]  # one logical line, before fitting to the width


def _title(v: PanelView) -> list[Pieces]:
    r, s = v.record, v.step
    if s is None:
        return [[("The generation loop", HEAD)]]
    t: Pieces = [(f"Forward pass {s.index + 1}", HEAD)]
    if s.index == 0:
        t.append((" · over the prompt", LABEL))
    if v.pinned:
        t.append((f" · selected token of reply {r.number}", DRAWN))
    elif v.generating:
        t.append((" · generating", _GENERATING))
    elif r is not None and r.finish is not None:
        label = finish_label(r.finish)
        t.append((f" · {label}" if v.compact else f" · done: {label}", LABEL))
    out = [t, *repeat_lines(s)]
    source = _remote(v)
    if source and not v.compact:
        what = [(" · full record", LABEL)] if s.sampled_top is not None else []
        out.append([("server ", LABEL), (source, _NONE), *what])
    if r is not None and r.mode == BLOCKING and not v.pinned:
        out.append([("blocking mode: what the model does while the caller waits", _BLOCKING)])
    return out


def _candidates(v: PanelView, width: int, k: int | None = None, bars: bool = True) -> list[Line]:
    """The top-k table as screen lines, columns one space apart (like a rich Table.grid)."""
    s = v.step
    assert s is not None
    rows: tuple[Candidate, ...] = s.raw_top[:k] if k else s.raw_top
    if s.sampled_top is None:  # a server's logprobs: no sampled-from distribution
        return _server_candidates(v, s, rows, width, bars)
    sampled = s.sampled_top
    probs = {c.token_id: c.prob for c in sampled}
    complete = s.candidates_kept is not None and s.candidates_kept <= len(sampled)  # every kept token is listed
    token_w = 10 if v.width >= 44 else 8
    # marker 1 + token + 4 gaps + 2 x (bar + 6-wide percentage)
    bar_w = max(4, min(12, (v.width - 2 - token_w - 4 - 12) // 2)) if bars else 0
    # narrower than the table (a very small terminal): the token column gives way
    token_w = max(1, min(token_w, width - (18 + 2 * bar_w if bars else 16)))
    out: list[Line] = []
    head: Pieces = [(f"  {'top ' + str(len(rows)):<{token_w}} ", LABEL)]
    if bars:
        head.append((f"{'raw softmax':<{bar_w + 7}}", LABEL))
    else:
        head.append((f"{'raw':>6} ", LABEL))
    head.append(("after sampling" if bars else "sampled", LABEL))
    _fit(head, width, out, no_wrap=True)
    drawn_listed = False
    for c in rows:
        drawn = c.token_id == s.token_id
        drawn_listed |= drawn
        sp = probs.get(c.token_id)
        style = DRAWN if drawn else None
        t: Pieces = [
            ("▶" if drawn else " ", DRAWN),
            (" ", _NONE),
            (cell(token_face(c.text, c.piece_bytes), token_w), style or _TOKEN),
            (" ", _NONE),
        ]
        if bars:
            t.append((bar(c.prob, bar_w), _RAW_BAR))
            t.append((" ", _NONE))
        t.append((cell(fmt_prob(c.prob), 6, right=True), style or _NONE))
        t.append((" ", _NONE))
        if bars:
            t.append((bar(sp or 0.0, bar_w), _SAMPLED_BAR))
            t.append((" ", _NONE))
        if sp is None:
            t.append((cell("cut" if complete else "–", 6, right=True), style or _DIM))
        else:
            t.append((cell(fmt_prob(sp), 6, right=True), style or _NONE))
        out.append(tuple(t))
    if not drawn_listed:
        t = [("▶", DRAWN), (" ", _NONE), (cell(token_face(s.piece, s.piece_bytes), token_w), DRAWN), (" ", _NONE)]
        if bars:
            t.append((cell(f"rank {s.raw_rank}", bar_w), LABEL))
            t.append((" ", _NONE))
        t.append((cell(fmt_prob(s.raw_prob), 6, right=True), DRAWN))
        t.append((" ", _NONE))
        if bars:
            t.append((cell(f"rank {s.sampled_rank}", bar_w), LABEL))
            t.append((" ", _NONE))
        t.append((cell(fmt_prob(s.sampled_prob), 6, right=True), DRAWN))
        out.append(tuple(t))
    return out


def _server_candidates(v: PanelView, s: Step, rows: tuple[Candidate, ...], width: int, bars: bool) -> list[Line]:
    """A remote server's top log-probabilities (as probabilities): one column, since the
    distribution the server sampled from is not given."""
    out: list[Line] = []
    if s.raw_prob is None and not rows:
        _fit([("  candidates ", LABEL), (NOT_GIVEN, _DIM), (" (the server sent no logprobs)", LABEL)], width, out)
        return out
    token_w = 10 if v.width >= 44 else 8
    bar_w = max(4, min(20, v.width - 2 - token_w - 2 - 6 - 1)) if bars else 0
    token_w = max(1, min(token_w, width - (10 + bar_w if bars else 8)))
    head: Pieces = [
        (f"  {'top ' + str(len(rows)):<{token_w}} ", LABEL),
        ("server's logprobs" if bars else "logprobs", LABEL),
    ]
    _fit(head, width, out, no_wrap=True)
    drawn_listed = False
    for c in rows:
        drawn = _is_drawn(c, s)
        drawn_listed |= drawn
        style = DRAWN if drawn else None
        t: Pieces = [
            ("▶" if drawn else " ", DRAWN),
            (" ", _NONE),
            (cell(token_face(c.text, c.piece_bytes), token_w), style or _TOKEN),
            (" ", _NONE),
        ]
        if bars:
            t += [(bar(c.prob, bar_w), _RAW_BAR), (" ", _NONE)]
        t.append((cell(fmt_prob(c.prob), 6, right=True), style or _NONE))
        out.append(tuple(t))
    if not drawn_listed:
        rank = f"rank {s.raw_rank}" if s.raw_rank is not None else f"not in top {len(s.raw_top)}"
        t = [("▶", DRAWN), (" ", _NONE), (cell(token_face(s.piece, s.piece_bytes), token_w), DRAWN), (" ", _NONE)]
        if bars:
            t += [(cell(rank, bar_w), LABEL), (" ", _NONE)]
        t.append((cell(fmt_prob(s.raw_prob) if s.raw_prob is not None else "–", 6, right=True), DRAWN))
        out.append(tuple(t))
    return out


#: the keys of the die bar, as the stopped panel lists them
STOPPED_KEYS = "Enter draws · n draws 10 · 1–9 pick · / search · F12 runs · Esc stops"


def _last_draw(v: PanelView) -> Pieces | None:
    """Step mode: the token the step before the pending draw put in (what the last key did)."""
    p, r = v.pending, v.record
    if p is None or r is None or not r.steps or r.steps[-1].index != p.index - 1:
        return None
    s = r.steps[-1]
    how = {"hand": "picked by hand", "step": "drawn"}.get(s.chosen_by, "drawn (running freely)")
    sp = fmt_prob(s.sampled_prob) if s.sampled_prob else "cut"
    return [
        (f"token {s.index + 1} ", LABEL),
        (token_face(s.piece, s.piece_bytes), DRAWN),
        (f" {how} · ", LABEL),
        (f"{fmt_prob(s.raw_prob or 0.0)} raw, {sp} after sampling", _NONE),
    ]


def _pending_lines(v: PanelView, width: int) -> list[Line]:
    """Step mode: the die of the pending draw, raw and after sampling, numbered for the
    digit keys (raw softmax order; a row the filters cut can be picked too). A short
    panel (80x24: under the transcript) keeps the rows the keys need: no blank lines, no
    key list (the die bar has it), the settings on one line (with the key list again if
    it fits), fewer candidates (down to 3), then no entropy and no last draw."""
    p = v.pending
    assert p is not None
    head: list[Line] = []
    _fit([(f"Stopped before the draw of token {p.index + 1}", HEAD)], width, head)
    keys: list[Line] = []
    _fit([(STOPPED_KEYS, _PENDING)], width, keys)
    last: list[Line] = []
    if (drawn := _last_draw(v)) is not None:
        _fit(drawn, width, last)
    sampled = {c.token_id: c.prob for c in p.sampled_top}
    complete = p.candidates_kept <= len(p.sampled_top)
    token_w = 10 if width >= 44 else 8
    bar_w = max(4, min(12, (width - 4 - token_w - 4 - 12) // 2))

    def table(k: int) -> list[Line]:
        out: list[Line] = []
        _fit(
            [
                (f"    {'top ' + str(k):<{token_w}} ", LABEL),
                (f"{'raw softmax':<{bar_w + 7}}", LABEL),
                ("after sampling", LABEL),
            ],
            width,
            out,
            no_wrap=True,
        )
        for i, c in enumerate(p.raw_top[:k]):
            sp = sampled.get(c.token_id)
            t: Pieces = [
                (f"{i + 1:>2}  " if i < 9 else "    ", DRAWN),
                (cell(token_face(c.text, c.piece_bytes), token_w), _TOKEN),
                (" ", _NONE),
                (bar(c.prob, bar_w), _RAW_BAR),
                (" ", _NONE),
                (cell(fmt_prob(c.prob), 6, right=True), _NONE),
                (" ", _NONE),
                (bar(sp or 0.0, bar_w), _SAMPLED_BAR),
                (" ", _NONE),
                (
                    cell(fmt_prob(sp) if sp is not None else ("cut" if complete else "–"), 6, right=True),
                    _NONE if sp is not None else _DIM,
                ),
            ]
            _fit(t, width, out, no_wrap=True)
        return out

    kept = p.candidates_kept
    entropy: list[Line] = []
    _fit(
        [
            ("entropy ", LABEL),
            (f"{p.raw_entropy:.2f} → {p.sampled_entropy:.2f} bits", _NONE),
            (f" · {kept} token{'s' if kept != 1 else ''} kept", LABEL),
        ],
        width,
        entropy,
    )
    st = p.settings
    lines: list[Pieces] = [[("Settings of this draw", HEAD), ("  (^↑/^↓ or F2 reshape the die)", LABEL)]]
    for name in KNOBS:
        lines.append(
            [
                ("▸ " if name == v.knob else "  ", DRAWN),
                (f"{SETTING[name].label:<12}", _BOLD if name == v.knob else LABEL),
                (f"{fmt_value(name, getattr(st, name)):>6}", _NONE),
            ]
        )
    lines.append([(f"  seed {fmt_value('seed', st.seed)} · context {p.n_past} tokens", LABEL)])
    settings: list[Line] = []
    _fit_all(lines, width, settings)
    n = len(p.raw_top)
    rows = table(n)
    full = [*head, *keys, *last, _BLANK, *rows, _BLANK, *entropy, _BLANK, *settings]
    if not v.height or len(full) <= v.height:
        return full
    if len(full) - 3 <= v.height:  # without the blank lines
        return [*head, *keys, *last, *rows, *entropy, *settings]
    if len(full) - 3 - len(keys) <= v.height:  # and without the keys (the die bar under the panel says them)
        return [*head, *last, *rows, *entropy, *settings]
    # short: the settings on one line (the knob the keys change marked ▸), no blank lines
    settings = []
    short: Pieces = []
    for name in KNOBS:
        item: Pieces = [
            ("▸" if name == v.knob else "", DRAWN),
            (SETTING[name].label + " ", _BOLD if name == v.knob else LABEL),
            (fmt_value(name, getattr(st, name)) + "  ", _NONE),
        ]
        if short and _width_of(short) + _width_of(item) > width:  # a setting is not split
            _fit(short, width, settings)
            short = []
        short += item
    _fit(short + [("(^↑/^↓ F2)", LABEL)], width, settings)
    over = len(head) + len(keys) + len(last) + len(rows) + len(entropy) + len(settings) - v.height
    if over > 0:  # without the keys (the die bar under the panel says them too)
        over, keys = over - len(keys), []
    if over > 0:  # fewer candidates (down to 3), then without the entropy and the last draw
        rows = table(max(3, n - over))
        over -= n + 1 - len(rows)
    if over > 0:
        over, entropy = over - len(entropy), []
    if over > 0:
        last = []
    return [*head, *keys, *last, *rows, *entropy, *settings]


def _drawn(v: PanelView) -> list[Pieces]:
    s = v.step
    assert s is not None
    if s.chosen_by == "hand":
        sp = fmt_prob(s.sampled_prob) if s.sampled_prob else "cut by sampling"
        return [
            [
                ("picked by hand ", DRAWN),
                (token_face(s.piece, s.piece_bytes), DRAWN),
                (" · rank " + str(s.raw_rank) + " raw", LABEL),
            ],
            [("probability ", LABEL), (f"{fmt_prob(s.raw_prob or 0.0)} raw, {sp} after sampling", _NONE)],
        ]
    first: Pieces = [("drew ", LABEL), (token_face(s.piece, s.piece_bytes), DRAWN)]
    if s.chosen_by == "step":
        first.append((" (a step you asked for)", LABEL))
    if s.is_stop:
        first.append((" (end of reply)", LABEL))
    if s.sampled_top is None:  # a server's logprobs
        if s.raw_rank is not None:
            first.append((f" · rank {s.raw_rank} in the server's logprobs", LABEL))
        elif s.raw_prob is not None:
            first.append((f" · not in the server's top {len(s.raw_top)}", LABEL))
    else:
        first.append((f" · rank {s.raw_rank} raw, {s.sampled_rank} sampled", LABEL))
    kept = s.candidates_kept
    if s.sampled_top is None and s.raw_entropy is None and kept is None:
        return [first, [("after sampling, entropy, tokens kept: ", LABEL), (NOT_GIVEN, _DIM)]]
    second: Pieces = [("entropy ", LABEL)]
    if s.raw_entropy is None or s.sampled_entropy is None:
        second.append((NOT_GIVEN, _DIM))
    else:
        second.append((f"{s.raw_entropy:.2f} → {s.sampled_entropy:.2f} bits", _NONE))
    if kept is None:
        second += [(" · tokens kept ", LABEL), (NOT_GIVEN, _DIM)]
    else:
        second.append((f" · {kept} token{'s' if kept != 1 else ''} kept", LABEL))
    return [first, second]


_SHORT_LATENCY = {
    "first token": "TTFT",
    "this pass": "pass",
    "per pass": "passes",
    "arrival gap": "arrival",
    "per chunk": "chunks",
}


def stepped(r: ReplyRecord) -> bool:
    """Some of the reply's tokens were drawn in step mode and its tokens a second include
    the stops, the user's time (a trace from before Finish.paused_ms, which the engine
    now leaves out of them)."""
    return r.stepped and not (r.finish is not None and r.finish.paused_ms)


def _latency(v: PanelView, spark_width: int, caches: PanelCaches) -> list[Pieces]:
    r, s = v.record, v.step
    assert r is not None and s is not None
    compact = v.compact
    label_w = 8 if compact else 12
    short = _SHORT_LATENCY if compact else {}
    out: list[Pieces] = []

    def row(label: str, *value: tuple[str, Style]) -> None:
        label = short.get(label, label)
        out.append([(f"{label:<{label_w}}", LABEL), *value])

    p = r.prefill
    arrivals = s.forward_ms is None  # a server's chunks: their arrival times are all there is
    if p is not None:
        row("prefill", (_prefill_text(p), _NONE))
    elif arrivals and r.finish is not None and r.finish.prefill_ms is not None:  # llama.cpp's timings
        row(
            "prefill",
            (fmt_ms(r.finish.prefill_ms), _NONE),
            *([(" (the server's timing)", LABEL)] if not compact else []),
        )
    elif arrivals:
        row("prefill", (NOT_GIVEN, _DIM))
    f = r.finish
    stop_note = ""
    if f is not None and f.steps and f.ttft_ms is not None:
        ttft = fmt_ms(f.ttft_ms)
        if f.paused_ms:  # the engine left its waits for the user out
            stop_note = " (step-mode stops left out)"
        elif r.first_token_stopped:
            stop_note = " (incl. step-mode stop)"  # a trace from before Finish.paused_ms
    elif r.own_steps and r.own_steps[0].elapsed_ms:  # a branch's: its own first, not its prefix's
        ttft = fmt_ms(r.own_steps[0].elapsed_ms)  # measured by the engine at step 0 (a server's: on arrival)
        if r.first_token_stopped:
            stop_note = " (incl. step-mode stop)"
    else:
        ttft = "—"
    row(
        "first token",
        (ttft, _NONE),
        *([(" at the client", LABEL)] if arrivals and ttft != "—" and not compact else []),
        *([(stop_note, LABEL)] if stop_note else []),
    )
    if arrivals:
        row("this pass", (NOT_GIVEN, _DIM), *([(" (forward, sampling)", LABEL)] if not compact else []))
    else:
        fwd = "prefill" if s.index == 0 else fmt_ms(s.forward_ms)
        sample = fmt_ms(s.sample_ms) if s.sample_ms is not None else NOT_GIVEN
        if compact:
            row("this pass", (f"{fwd} + {sample} sampling", _NONE))
        else:
            row("this pass", (f"{fwd} forward + {sample} sampling", _NONE))
    if s.arrival_ms is not None:  # measured at the client: network and server pace, not a pass
        since = "since the request" if s.index == 0 else "between chunks"
        row("arrival gap", (fmt_ms(s.arrival_ms), _NONE), *([(f" {since}", LABEL)] if not compact else []))
    index = caches.record_index(r)
    if s.threads is None:
        row("threads", (NOT_GIVEN, _DIM))
    elif s.threads:  # 0: a trace from before threads were recorded
        row("threads", *_threads(s, r, index, compact))
    # a past token: the passes up to it (once, not per frame); else the whole reply's blocks
    upto = s.index if v.pinned else None
    decode, lo, hi, _ = _drawn_series(index.latency, upto)
    if decode:
        row(
            "per chunk" if index.arrivals else "per pass",
            (_spark(index.latency, decode, upto, spark_width), _SPARK),
            (f"  {fmt_ms_range(lo, hi)}", LABEL),
        )
    if not compact:
        out.extend(_uncertainty(index, s.index + 1 if v.pinned else None, spark_width, label_w))
    rate = _arrival_rate(r) if arrivals else r.live_tokens_per_s()
    speed = f"{fmt_rate(rate)} live" if rate and not f else ""
    if f and f.tokens_per_s:
        speed = f"{fmt_rate(f.tokens_per_s)} (whole reply{', no stops' if f.paused_ms else ''})"
        if stepped(r):  # the wall clock holds the stops: the passes' own times instead
            rate = r.live_tokens_per_s(window=len(r.steps))
            speed = f"{fmt_rate(rate)} (passes only, no stops)" if rate else "—"
    if arrivals and speed:
        speed = speed.replace(" tok/s", " tok/s arriving", 1)
    row("speed", (speed or "—", _NONE))
    if r.start is not None:
        n_ctx, n_past = r.start.n_ctx, r.context_used(s)  # (a server's: n_ctx from GET /models, used at the end)
        if n_ctx is None or n_past is None:
            row("context", (NOT_GIVEN if n_ctx is None else f"? / {n_ctx:,} tokens (known at the end)", _DIM))
        else:
            pct = "" if compact else f" ({100 * n_past / n_ctx:.0f}%)"
            row("context", (f"{n_past:,} / {n_ctx:,} tokens{pct}", _NONE))
    _rstrip(out[-1])
    return out


def _drawn_series(series: Series, upto: int | None) -> tuple[list[float | None], float, float, int | None]:
    """What a sparkline of `series` draws: (values, min, max, position of the max); the
    whole reply's block maxima (upto None: O(blocks), whatever the reply's length), or the
    values before position `upto` (a selected past token: once per selection)."""
    if upto is None:
        return series.blocks, series.lo, series.hi, series.peak
    values = series.values[:upto]
    given = [(x, i) for i, x in enumerate(values) if x is not None]
    if not given:
        return values, 0.0, 0.0, None
    hi, peak = max(given, key=lambda g: (g[0], -g[1]))
    return values, min(given)[0], hi, peak


def _spark(series: Series, values: list[float | None], upto: int | None, width: int) -> str:
    return series.spark(width) if upto is None else sparkline(values, width)


def _uncertainty(index: ReplyIndex, upto: int | None, spark_width: int, label_w: int) -> list[Pieces]:
    """Under the pass times, over the same reply: the surprisal of each drawn token and
    the entropy of each pass, in bits of the raw softmax (what the model said, before the
    sampler's filters), with their range and the pass of the most surprising token.
    A step whose figure is not given (a server without logprobs) is a gap."""
    out: list[Pieces] = []
    peak_pass = None
    for label, series in (("surprisal", index.surprisal), ("entropy", index.entropy)):
        values, lo, hi, peak = _drawn_series(series, upto)
        if not values:
            continue
        if peak is None:  # nothing given in the passes shown
            out.append([(f"{label:<{label_w}}", LABEL), (NOT_GIVEN, _DIM)])
            continue
        out.append(
            [
                (f"{label:<{label_w}}", LABEL),
                (_spark(series, values, upto, spark_width), _UNSURE),
                (f"  {fmt_bits_range(lo, hi)}", LABEL),
            ]
        )
        if label == "surprisal":
            peak_pass = series.peak + 1 if upto is None else peak + 1  # steps count from pass 1
    if peak_pass is not None:
        # one line under the rows (the panel is spark_width + 30 wide: see panel_lines)
        caption = f"raw softmax · max surprisal: pass {peak_pass}"
        if len(caption) > spark_width + 30 - label_w:
            caption = f"raw · max surprisal: pass {peak_pass}"
        out.append([(" " * label_w, _NONE), (caption, LABEL)])
    return out


def _arrival_rate(r: ReplyRecord, window: int = 20) -> float | None:
    """Tokens a second arriving at the client over the last `window` tokens (a remote
    reply whose server sends no timings)."""
    steps = r.steps[-window:]
    if len(steps) < 2:
        return None
    ms = steps[-1].elapsed_ms - steps[0].elapsed_ms
    return (len(steps) - 1) * 1000.0 / ms if ms > 0 else None


def _threads(s: Step, r: ReplyRecord, index: ReplyIndex, compact: bool) -> Pieces:
    """The thread count of the pass shown, and why: auto's reason for its last change."""
    if r.start is None or not r.start.threads_auto:
        return [(f"{s.threads}", _NONE), (" pinned", LABEL)]
    note = index.threads_reason(s.index)
    out: Pieces = [
        (f"{s.threads}", _NONE),
        (" auto" + (f" (a probe's pass cut at {s.probe_cut_ms:.0f} ms, redone)" if s.probe_cut_ms else ""), LABEL),
    ]
    if note is not None and not compact:
        at, reason = note
        where = "at this pass" if at == s.index else f"pass {at + 1}"
        out.append((f" · {reason}, {where}" if at else f" · {reason}", LABEL))
    return out


def _settings(v: PanelView, width: int, out: list[Line], caches: PanelCaches) -> None:
    """The settings block, fitted to `width` (cached until anything it shows changes)."""
    r, s = v.record, v.step
    # between replies the settings the next reply will use (the keys change them); during
    # a reply, or on a selected token, those in force at the pass shown
    ahead = s is None or (v.takes_messages and not v.generating and not v.pinned)
    shown = v.live if ahead else s.settings
    changes = caches.changes(r) if s is not None else {}
    key = (
        width,
        shown,
        v.knob,
        tuple(changes.items()),
        s is None,
        s is None and v.generating,
        (s.settings_changed, s.index > 0) if s is not None else None,
        s.index if (s is not None and v.pinned) else None,
        v.live if (s is not None and v.generating and not v.pinned) else None,
        _remote(v),
    )
    if caches.settings is not None and caches.settings[0] == key:
        out.extend(caches.settings[1])
        return
    when = "  (at this pass)" if not ahead else "  (its first draw)" if s is None and v.generating else "  (next reply)"
    lines: list[Pieces] = [[("Sampling settings", HEAD), (when, LABEL)]]
    for name in KNOBS:
        value = getattr(shown, name)
        t: Pieces = [
            ("▸ " if name == v.knob else "  ", DRAWN),
            (f"{SETTING[name].label:<12}", _BOLD if name == v.knob else LABEL),
            (f"{fmt_value(name, value):>6}", _NONE),
        ]
        at = changes.get(name)
        was = getattr(s.settings, name) if s is not None else value
        if ahead and s is not None and was != value:
            t.append((f"  reply {r.number} had {fmt_value(name, was)}", _PENDING))
        elif s is not None and name in s.settings_changed and s.index > 0:
            t.append(("  ◀ changed at this pass", CHANGED))
        elif at is not None and (not v.pinned or at <= s.index):
            t.append((f"  changed at pass {at + 1}", CHANGED))
        pending = getattr(v.live, name)
        if s is not None and v.generating and not v.pinned and pending != value:
            when = "next reply" if _remote(v) else "from next pass"  # a server fixed this reply's
            t.append((f"  → {fmt_value(name, pending)} {when}", _PENDING))
        lines.append(t)
    repeat = f"  repeat ×{shown.repeat_penalty:.2f} over {shown.repeat_last_n}"
    seed = f"{fmt_dry(shown)}seed {fmt_value('seed', shown.seed)}"  # (DRY, when on, goes with the seed)
    one = f"{repeat} · {seed} · max {shown.max_tokens}"
    if len(one) <= width:
        lines.append([(one, LABEL)])
    else:  # (a pinned 10-digit seed: the line wrapped between "max" and its number)
        lines += [[(f"{repeat} · max {shown.max_tokens}", LABEL)], [(f"  {seed}", LABEL)]]
    lines.append([("  ^↑/^↓ change ▸ · F8 next · F2 type values", _DIM)])
    other = [n for n in changes if n not in KNOBS]
    if other:
        lines.append([("  changed: " + ", ".join(f"{n} at pass {changes[n] + 1}" for n in other), CHANGED)])
    fitted: list[Line] = []
    _fit_all(lines, width, fitted)
    caches.settings = (key, fitted)
    out.extend(fitted)


def _prefill_text(p: Prefill) -> str:
    reused = f", {p.reused_tokens:,} reused" if p.reused_tokens else ""
    return f"{p.prompt_tokens:,} tokens{reused} in {fmt_ms(p.ms)}"


def _starting(v: PanelView) -> list[Pieces]:
    """A reply sent, its first pass not yet over: the prompt being read (a long one, or a
    conversation reopened, takes seconds on a CPU: the panel says what runs)."""
    r = v.record
    assert r is not None
    out: list[Pieces] = [[("Forward pass 1", HEAD), (" · reading the prompt", _GENERATING)]]
    if r.mode == BLOCKING:
        out.append([("blocking mode: what the model does while the caller waits", _BLOCKING)])
    st, p = r.start, r.prefill
    if p is not None:
        out.append([("prefill ", LABEL), (_prefill_text(p), _NONE)])
    elif st is not None and st.prompt_token_ids is not None:
        ctx = f" (context {st.n_ctx:,})" if st.n_ctx else ""
        out.append([("prompt ", LABEL), (f"{len(st.prompt_token_ids):,} tokens{ctx}", _NONE)])
    if p is None:
        remote = st is not None and st.prompt_token_ids is None
        out.append(
            [
                (
                    "waiting for the server's first chunk"
                    if remote
                    else "the first pass runs the model over the whole prompt at once (prefill, less what the "
                    "KV cache holds); the candidates of the first token appear when it ends",
                    _WELCOME,
                )
            ]
        )
    return out


def _welcome(v: PanelView) -> list[Pieces]:
    lines: list[Pieces] = [[(_WELCOME_TEXT, _WELCOME)]]
    if v.model:
        lines += [[], [("model ", LABEL), (v.model, _NONE)]]
    return lines


def _compact_settings(v: PanelView, caches: PanelCaches) -> list[Pieces]:
    s = v.step
    ahead = s is None or (v.takes_messages and not v.generating and not v.pinned)
    shown = v.live if ahead else s.settings
    changes = {} if ahead else caches.changes(v.record)
    lines: list[Pieces] = []
    t: Pieces = []
    for i, name in enumerate(KNOBS):
        t.append(("▸" if name == v.knob else " ", DRAWN))
        t.append((f"{SETTING[name].short} ", LABEL))
        t.append((fmt_value(name, getattr(shown, name)), CHANGED if name in changes else _NONE))
        if name in changes:
            t.append((f"@{changes[name] + 1}", CHANGED))
        if i % 2 == 0:
            t.append(("  ", _NONE))
        else:
            lines.append(t)
            t = []
    _rstrip(lines[-1])
    return lines


_BLANK: Line = ()
_LATENCY_HEAD: Line = (("Latency", HEAD),)


def panel_lines(v: PanelView, caches: PanelCaches | None = None) -> list[Line]:
    """The panel as screen lines, each at most `v.width` cells wide."""
    caches = caches or PanelCaches()
    width = v.width
    if v.pending is not None and not v.pinned:
        return _pending_lines(v, width)
    out: list[Line] = []
    if v.step is None or v.record is None:
        starting = v.record is not None and v.generating
        _fit_all(_starting(v) if starting else _title(v), width, out)
        out.append(_BLANK)
        if not starting:
            _fit_all(_welcome(v), width, out)
            out.append(_BLANK)
        _settings(v, width, out, caches)
        return out
    if v.compact:
        # two halves (the left one takes the odd cell), the left one ending in a 2-cell gap
        left_w = (width + 1) // 2 - 2
        right_w = width - left_w - 2
        half = max(30, width // 2 - 2)
        left_v = PanelView(**{**v.__dict__, "width": half})
        left: list[Line] = []
        _fit_all(_title(v), left_w, left)
        left.extend(_candidates(left_v, left_w, k=5, bars=False))
        right: list[Line] = []
        _fit_all(_latency(left_v, max(8, half - 22), caches), right_w, right, no_wrap=True)
        _fit_all(_compact_settings(v, caches), right_w, right)
        for i in range(max(len(left), len(right))):
            if i < len(left):
                a = left[i]
                gap = left_w - _width_of(a) + 2
            else:
                a, gap = (), left_w + 2
            out.append(a + ((" " * gap, _NONE), *right[i]) if i < len(right) else a)
        return out
    head: list[Line] = []
    _fit_all(_title(v), width, head)
    tail: list[Line] = []
    _fit_all(_drawn(v), width, tail)
    tail.append(_BLANK)
    tail.append(_LATENCY_HEAD)
    _fit_all(_latency(v, max(8, width - 30), caches), width, tail)
    tail.append(_BLANK)
    _settings(v, width, tail, caches)
    table = _candidates(v, width)
    if v.height and len(head) + len(table) + len(tail) > v.height:
        # a short terminal: fewer candidates (down to 3) before anything below is cut
        # (the settings the keys change stay in view as long as they can)
        over = len(head) + len(table) + len(tail) - v.height
        table = _candidates(v, width, k=max(3, len(v.step.raw_top) - over))
    out.extend(head)
    out.extend(table)
    out.extend(tail)
    return out


def panel_renderable(v: PanelView) -> Text:
    """The whole panel as one Text (lines already fitted to `v.width`)."""
    return lines_to_text(panel_lines(v))


def _view_key(v: PanelView) -> tuple:
    """Everything the panel shows depends on; equal keys draw the same panel."""
    r, s = v.record, v.step
    if r is None:
        rk: tuple = ()
    else:
        rk = (r, r.mode, r.number, len(r.steps), r.prefill, r.finish, r.start is not None)
    return (rk, s, v.live, v.knob, v.pinned, v.generating, v.compact, v.width, v.height, v.model, v.pending)


class LoopPanel(Widget):
    """Redrawn at most once per frame, only when something it shows changed.

    The border and padding (#panel in styles.tcss) belong to this widget, which is never
    repainted per frame; the lines live in a borderless FastStatic child, so a frame only
    repaints the changed lines of that child (border drawing is the costly part of a
    Textual line repaint).
    """

    DEFAULT_CSS = """
    LoopPanel > FastStatic {
        width: 100%;
        height: 100%;
    }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.border_title = "Loop"
        self.view: PanelView | None = None
        self._key: tuple | None = None
        self._caches = PanelCaches()
        self.body = FastStatic()

    def compose(self) -> ComposeResult:
        yield self.body

    @property
    def text(self) -> Text:
        """What the panel shows, as one Text."""
        return self.body.render()

    def show(self, view: PanelView) -> None:
        self.view = view
        view.width = max(30, self.content_size.width or view.width)
        view.height = self.content_size.height or view.height
        key = _view_key(view)
        if key == self._key:
            return
        self._key = key
        self.body.set_lines(panel_lines(view, self._caches))

    def on_resize(self) -> None:
        if self.view is not None:
            self.show(self.view)
