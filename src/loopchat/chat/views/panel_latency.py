"""The loop panel's latency block: the prefill, the first token, the pass shown (forward
and sampling), the thread count and why, the pass times over the reply as a sparkline
(with the surprisal and entropy under them), the speed and the context used. A remote
reply: the arrival gaps at the client, and "not given" for what the server does not send.
"""

from __future__ import annotations

from rich.style import Style

from loopchat.batch import pass_line
from loopchat.chat.conversation import ReplyRecord
from loopchat.chat.plots import fmt_bits_range, fmt_ms, fmt_ms_range, fmt_rate, sparkline
from loopchat.chat.views.lines import Pieces, rstrip
from loopchat.chat.views.panel_view import DIM, LABEL, NONE, SPARK, UNSURE, PanelView
from loopchat.chat.views.reply_index import PanelCaches, ReplyIndex, Series
from loopchat.event_lines import NOT_GIVEN
from loopchat.events import Prefill, Step

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


class _Rows:
    """The block's rows: a label column (short labels in the compact panel), then values."""

    def __init__(self, compact: bool) -> None:
        self.compact = compact
        self.label_w = 8 if compact else 12
        self.short = _SHORT_LATENCY if compact else {}
        self.out: list[Pieces] = []

    def row(self, label: str, *value: tuple[str, Style]) -> None:
        label = self.short.get(label, label)
        self.out.append([(f"{label:<{self.label_w}}", LABEL), *value])


def _prefill_row(rows: _Rows, r: ReplyRecord, arrivals: bool) -> None:
    compact = rows.compact
    p = r.prefill
    if p is not None:
        rows.row("prefill", (prefill_text(p), NONE))
    elif arrivals and r.finish is not None and r.finish.prefill_ms is not None:  # llama.cpp's timings
        rows.row(
            "prefill",
            (fmt_ms(r.finish.prefill_ms), NONE),
            *([(" (the server's timing)", LABEL)] if not compact else []),
        )
    elif arrivals:
        rows.row("prefill", (NOT_GIVEN, DIM))


def _first_token_row(rows: _Rows, r: ReplyRecord, arrivals: bool) -> None:
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
    rows.row(
        "first token",
        (ttft, NONE),
        *([(" at the client", LABEL)] if arrivals and ttft != "—" and not rows.compact else []),
        *([(stop_note, LABEL)] if stop_note else []),
    )


def _pass_rows(rows: _Rows, s: Step, arrivals: bool) -> None:
    compact = rows.compact
    if arrivals or s.forward_ms is None:  # (arrivals: forward_ms is None)
        rows.row("this pass", (NOT_GIVEN, DIM), *([(" (forward, sampling)", LABEL)] if not compact else []))
    else:
        fwd = "prefill" if s.index == 0 else fmt_ms(s.forward_ms)
        sample = fmt_ms(s.sample_ms) if s.sample_ms is not None else NOT_GIVEN
        if compact:
            rows.row("this pass", (f"{fwd} + {sample} sampling", NONE))
        else:
            rows.row("this pass", (f"{fwd} forward + {sample} sampling", NONE))
    if s.batch is not None:  # one of N replies in one batch (batch.py): the pass's cost against one sequence's
        rows.row("batch", (pass_line(s.batch), NONE))
    if s.arrival_ms is not None:  # measured at the client: network and server pace, not a pass
        since = "since the request" if s.index == 0 else "between chunks"
        rows.row("arrival gap", (fmt_ms(s.arrival_ms), NONE), *([(f" {since}", LABEL)] if not compact else []))


def _speed_row(rows: _Rows, r: ReplyRecord, arrivals: bool) -> None:
    f = r.finish
    rate = arrival_rate(r) if arrivals else r.live_tokens_per_s()
    speed = f"{fmt_rate(rate)} live" if rate and not f else ""
    if f and f.tokens_per_s:
        speed = f"{fmt_rate(f.tokens_per_s)} (whole reply{', no stops' if f.paused_ms else ''})"
        if stepped(r):  # the wall clock holds the stops: the passes' own times instead
            rate = r.live_tokens_per_s(window=len(r.steps))
            speed = f"{fmt_rate(rate)} (passes only, no stops)" if rate else "—"
    if arrivals and speed:
        speed = speed.replace(" tok/s", " tok/s arriving", 1)
    rows.row("speed", (speed or "—", NONE))


def _context_row(rows: _Rows, r: ReplyRecord, s: Step) -> None:
    if r.start is not None:
        n_ctx, n_past = r.start.n_ctx, r.context_used(s)  # (a server's: n_ctx from GET /models, used at the end)
        if n_ctx is None or n_past is None:
            rows.row("context", (NOT_GIVEN if n_ctx is None else f"? / {n_ctx:,} tokens (known at the end)", DIM))
        else:
            pct = "" if rows.compact else f" ({100 * n_past / n_ctx:.0f}%)"
            rows.row("context", (f"{n_past:,} / {n_ctx:,} tokens{pct}", NONE))


def latency(v: PanelView, spark_width: int, caches: PanelCaches) -> list[Pieces]:
    """The latency block's logical lines for the step shown."""
    r, s = v.record, v.step
    assert r is not None and s is not None
    rows = _Rows(v.compact)
    arrivals = s.forward_ms is None  # a server's chunks: their arrival times are all there is
    _prefill_row(rows, r, arrivals)
    _first_token_row(rows, r, arrivals)
    _pass_rows(rows, s, arrivals)
    index = caches.record_index(r)
    if s.threads is None:
        rows.row("threads", (NOT_GIVEN, DIM))
    elif s.threads:  # 0: a trace from before threads were recorded
        rows.row("threads", *threads_row(s, r, index, v.compact))
    # a past token: the passes up to it (once, not per frame); else the whole reply's blocks
    upto = s.index if v.pinned else None
    decode, lo, hi, _ = drawn_series(index.latency, upto)
    if decode:
        rows.row(
            "per chunk" if index.arrivals else "per pass",
            (spark(index.latency, decode, upto, spark_width), SPARK),
            (f"  {fmt_ms_range(lo, hi)}", LABEL),
        )
    if not v.compact:
        rows.out.extend(uncertainty(index, s.index + 1 if v.pinned else None, spark_width, rows.label_w))
    _speed_row(rows, r, arrivals)
    _context_row(rows, r, s)
    rstrip(rows.out[-1])
    return rows.out


def drawn_series(series: Series, upto: int | None) -> tuple[list[float | None], float, float, int | None]:
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


def spark(series: Series, values: list[float | None], upto: int | None, width: int) -> str:
    return series.spark(width) if upto is None else sparkline(values, width)


def uncertainty(index: ReplyIndex, upto: int | None, spark_width: int, label_w: int) -> list[Pieces]:
    """Under the pass times, over the same reply: the surprisal of each drawn token and
    the entropy of each pass, in bits of the raw softmax (what the model said, before the
    sampler's filters), with their range and the pass of the most surprising token.
    A step whose figure is not given (a server without logprobs) is a gap."""
    out: list[Pieces] = []
    peak_pass = None
    for label, series in (("surprisal", index.surprisal), ("entropy", index.entropy)):
        values, lo, hi, peak = drawn_series(series, upto)
        if not values:
            continue
        if peak is None:  # nothing given in the passes shown
            out.append([(f"{label:<{label_w}}", LABEL), (NOT_GIVEN, DIM)])
            continue
        out.append(
            [
                (f"{label:<{label_w}}", LABEL),
                (spark(series, values, upto, spark_width), UNSURE),
                (f"  {fmt_bits_range(lo, hi)}", LABEL),
            ]
        )
        if label == "surprisal":
            top = series.peak if upto is None and series.peak is not None else peak
            peak_pass = top + 1  # steps count from pass 1
    if peak_pass is not None:
        # one line under the rows (the panel is spark_width + 30 wide: see panel_lines); under a
        # draft a pass may give several tokens: the step is named by its token, not a pass
        unit = "token" if index.drafted else "pass"
        caption = f"raw softmax · max surprisal: {unit} {peak_pass}"
        if len(caption) > spark_width + 30 - label_w:
            caption = f"raw · max surprisal: {unit} {peak_pass}"
        out.append([(" " * label_w, NONE), (caption, LABEL)])
    return out


def arrival_rate(r: ReplyRecord, window: int = 20) -> float | None:
    """Tokens a second arriving at the client over the last `window` tokens (a remote
    reply whose server sends no timings)."""
    steps = r.steps[-window:]
    if len(steps) < 2:
        return None
    ms = steps[-1].elapsed_ms - steps[0].elapsed_ms
    return (len(steps) - 1) * 1000.0 / ms if ms > 0 else None


def threads_row(s: Step, r: ReplyRecord, index: ReplyIndex, compact: bool) -> Pieces:
    """The thread count of the pass shown, and why: auto's reason for its last change."""
    if r.start is None or not r.start.threads_auto:
        return [(f"{s.threads}", NONE), (" pinned", LABEL)]
    note = index.threads_reason(s.index)
    many = s.batch is not None or (s.forward_tokens or 1) > 1  # (its own count: docs/models.md, "threads")
    out: Pieces = [
        (f"{s.threads}", NONE),
        (
            " auto"
            + (" (a pass of many tokens)" if many else "")
            + (f" (a probe's pass cut at {s.probe_cut_ms:.0f} ms, redone)" if s.probe_cut_ms else ""),
            LABEL,
        ),
    ]
    if note is not None and not compact:
        at, reason = note
        where = "at this pass" if at == s.index else f"pass {at + 1}"
        out.append((f" · {reason}, {where}" if at else f" · {reason}", LABEL))
    return out


def prefill_text(p: Prefill) -> str:
    reused = f", {p.reused_tokens:,} reused" if p.reused_tokens else ""
    return f"{p.prompt_tokens:,} tokens{reused} in {fmt_ms(p.ms)}"
