"""The loop panel: one forward pass's record (candidates, timings, settings), drawn once
per frame from the latest Step event, or from a past step the user selected."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ..events import Candidate, Step
from ..settings import SamplingSettings
from .conversation import BLOCKING, ReplyRecord, finish_label
from .plots import bar, fmt_ms, fmt_prob, show_token, sparkline

KNOBS = ("temperature", "top_p", "top_k", "min_p")
HEAD = "bold #87d7ff"
LABEL = "#8a8a8a"
DRAWN = "bold #ffaf00"
CHANGED = "bold #ff87d7"


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
    model: str = ""


def _fmt_setting(name: str, value: float | int) -> str:
    if name in ("top_k", "repeat_last_n", "seed", "max_tokens"):
        return str(value)
    return f"{value:.2f}"


def _title(v: PanelView) -> Text:
    t = Text()
    r, s = v.record, v.step
    if s is None:
        t.append("The generation loop", style=HEAD)
        return t
    t.append(f"Forward pass {s.index + 1}", style=HEAD)
    if s.index == 0:
        t.append(" · over the prompt", style=LABEL)
    if v.pinned:
        t.append(f" · selected token of reply {r.number}", style=DRAWN)
    elif v.generating:
        t.append(" · generating", style="#5fd75f")
    elif r is not None and r.finish is not None:
        t.append(f" · {finish_label(r.finish)}" if v.compact else f" · done: {finish_label(r.finish)}", style=LABEL)
    if r is not None and r.mode == BLOCKING and not v.pinned:
        t.append("\n")
        t.append("blocking mode: what the model does while the caller waits", style="italic #87afd7")
    return t


def _sampled_lookup(step: Step) -> tuple[dict[int, float], bool]:
    probs = {c.token_id: c.prob for c in step.sampled_top}
    complete = step.candidates_kept <= len(step.sampled_top)  # every kept token is listed
    return probs, complete


def _candidates(v: PanelView, k: int | None = None, bars: bool = True) -> Group:
    s = v.step
    assert s is not None
    rows: list[Candidate] = list(s.raw_top[:k] if k else s.raw_top)
    probs, complete = _sampled_lookup(s)
    token_w = 10 if v.width >= 44 else 8
    # marker 1 + token + 4 gaps + 2 x (bar + 6-wide percentage)
    bar_w = max(4, min(12, (v.width - 2 - token_w - 4 - 12) // 2)) if bars else 0
    table = Table.grid(padding=(0, 1))
    table.add_column(width=1)
    table.add_column(width=token_w, no_wrap=True, overflow="ellipsis")
    for _ in range(2):
        if bars:
            table.add_column(width=bar_w, no_wrap=True)
        table.add_column(width=6, justify="right", no_wrap=True)
    head = Text(no_wrap=True, overflow="ellipsis")
    head.append(f"  {'top ' + str(len(rows)):<{token_w}} ", style=LABEL)
    if bars:
        head.append(f"{'raw softmax':<{bar_w + 7}}", style=LABEL)
    else:
        head.append(f"{'raw':>6} ", style=LABEL)
    head.append("after sampling" if bars else "sampled", style=LABEL)
    drawn_listed = False
    for c in rows:
        drawn = c.token_id == s.token_id
        drawn_listed |= drawn
        sp = probs.get(c.token_id)
        style = DRAWN if drawn else ""
        if sp is None:
            sp_text = Text("cut" if complete else "–", style=style or "dim")
            sp_val = 0.0
        else:
            sp_text = Text(fmt_prob(sp), style=style)
            sp_val = sp
        cells = [Text("▶" if drawn else "", style=DRAWN), Text(show_token(c.text), style=style or "#d0d0d0")]
        if bars:
            cells.append(Text(bar(c.prob, bar_w), style="#5f87af"))
        cells.append(Text(fmt_prob(c.prob), style=style))
        if bars:
            cells.append(Text(bar(sp_val, bar_w), style="#5faf5f"))
        cells.append(sp_text)
        table.add_row(*cells)
    if not drawn_listed:
        extra = [Text("▶", style=DRAWN), Text(show_token(s.piece), style=DRAWN)]
        if bars:
            extra.append(Text(f"rank {s.raw_rank}", style=LABEL, no_wrap=True))
        extra.append(Text(fmt_prob(s.raw_prob), style=DRAWN))
        if bars:
            extra.append(Text(f"rank {s.sampled_rank}", style=LABEL, no_wrap=True))
        extra.append(Text(fmt_prob(s.sampled_prob), style=DRAWN))
        table.add_row(*extra)
    return Group(head, table)


def _drawn(v: PanelView) -> Text:
    s = v.step
    assert s is not None
    t = Text()
    t.append("drew ", style=LABEL)
    t.append(show_token(s.piece), style=DRAWN)
    if s.is_stop:
        t.append(" (end of reply)", style=LABEL)
    t.append(f" · rank {s.raw_rank} raw, {s.sampled_rank} sampled", style=LABEL)
    t.append("\n")
    t.append("entropy ", style=LABEL)
    t.append(f"{s.raw_entropy:.2f} → {s.sampled_entropy:.2f} bits")
    kept = s.candidates_kept
    t.append(f" · {kept} token{'s' if kept != 1 else ''} kept", style=LABEL)
    return t


def _latency(v: PanelView, spark_width: int) -> Text:
    r, s = v.record, v.step
    assert r is not None and s is not None
    t = Text(no_wrap=v.compact, overflow="ellipsis")
    short = {"first token": "TTFT", "this pass": "pass", "per pass": "passes"} if v.compact else {}

    def row(label: str, value: str | Text) -> None:
        label = short.get(label, label)
        t.append(f"{label:<{8 if v.compact else 12}}", style=LABEL)
        t.append(value) if isinstance(value, Text) else t.append(value)
        t.append("\n")

    p = r.prefill
    if p is not None:
        reused = f", {p.reused_tokens} reused" if p.reused_tokens else ""
        row("prefill", f"{p.prompt_tokens} tokens{reused} in {fmt_ms(p.ms)}")
    f = r.finish
    row("first token", fmt_ms(f.ttft_ms) if f else ("at the end" if v.compact else "shown when the reply ends"))
    fwd = "prefill" if s.index == 0 else fmt_ms(s.forward_ms)
    if v.compact:
        row("this pass", f"{fwd} + {fmt_ms(s.sample_ms)} sampling")
    else:
        row("this pass", f"{fwd} forward + {fmt_ms(s.sample_ms)} sampling")
    decode = [x.forward_ms for x in r.steps[1 : (s.index + 1 if v.pinned else None)]]
    if decode:
        line = Text(sparkline(decode, spark_width), style="#5fafd7")
        line.append(f"  {min(decode):.1f}–{fmt_ms(max(decode))}", style=LABEL)
        row("per pass", line)
    rate = r.live_tokens_per_s()
    speed = f"{rate:.0f} tok/s live" if rate and not f else ""
    if f and f.tokens_per_s:
        speed = f"{f.tokens_per_s:.0f} tok/s (whole reply)"
    row("speed", speed or "—")
    if r.start is not None:
        n_ctx = r.start.n_ctx
        row("context", f"{s.n_past:,} / {n_ctx:,} tokens" + ("" if v.compact else f" ({100 * s.n_past / n_ctx:.0f}%)"))
    t.rstrip()
    return t


def _settings(v: PanelView) -> Text:
    r, s = v.record, v.step
    shown = s.settings if s is not None else v.live
    changes = r.last_change_steps() if (r is not None and s is not None) else {}
    t = Text()
    t.append("Sampling settings", style=HEAD)
    t.append("  (at this pass)" if s is not None else "  (next reply)", style=LABEL)
    t.append("\n")
    for name in KNOBS:
        value = getattr(shown, name)
        mark = "▸ " if name == v.knob else "  "
        t.append(mark, style=DRAWN)
        t.append(f"{name:<12}", style="bold" if name == v.knob else LABEL)
        t.append(f"{_fmt_setting(name, value):>6}")
        at = changes.get(name)
        if s is not None and name in s.settings_changed and s.index > 0:
            t.append("  ◀ changed at this pass", style=CHANGED)
        elif at is not None and (not v.pinned or at <= s.index):
            t.append(f"  changed at pass {at + 1}", style=CHANGED)
        pending = getattr(v.live, name)
        if s is not None and v.generating and not v.pinned and pending != value:
            t.append(f"  → {_fmt_setting(name, pending)} from next pass", style="#ffd75f")
        t.append("\n")
    t.append(
        f"  repeat ×{shown.repeat_penalty:.2f} over {shown.repeat_last_n} · seed {shown.seed}"
        f" · max {shown.max_tokens}",
        style=LABEL,
    )
    t.append("\n  ^↑/^↓ change ▸ · F8 next · F2 type values", style="dim")
    other = [n for n, at in changes.items() if n not in KNOBS]
    if other:
        t.append("\n  changed: " + ", ".join(f"{n} at pass {changes[n] + 1}" for n in other), style=CHANGED)
    return t


def _welcome(v: PanelView) -> Text:
    t = Text()
    t.append(
        "Each reply is made one token at a time: the model runs a forward pass over the "
        "context, gets a probability for every token of its vocabulary, and the sampler "
        "draws one. Send a message to watch it happen.",
        style="#bcbcbc",
    )
    if v.model:
        t.append(f"\n\nmodel ", style=LABEL)
        t.append(v.model)
    return t


def panel_renderable(v: PanelView) -> RenderableType:
    if v.step is None or v.record is None:
        return Group(_title(v), Text(""), _welcome(v), Text(""), _settings(v))
    if v.compact:
        grid = Table.grid(padding=(0, 2), expand=True)
        grid.add_column(ratio=1)
        grid.add_column(ratio=1)
        half = max(30, v.width // 2 - 2)
        left = PanelView(**{**v.__dict__, "width": half})
        grid.add_row(
            Group(_title(v), _candidates(left, k=5, bars=False)),
            Group(_latency(left, max(8, half - 22)), _compact_settings(v)),
        )
        return grid
    spark_w = max(8, v.width - 30)
    return Group(
        _title(v),
        _candidates(v),
        _drawn(v),
        Text(""),
        Text("Latency", style=HEAD),
        _latency(v, spark_w),
        Text(""),
        _settings(v),
    )


def _compact_settings(v: PanelView) -> Text:
    s = v.step
    shown = s.settings if s is not None else v.live
    changes = v.record.last_change_steps() if v.record else {}
    t = Text()
    for i, name in enumerate(KNOBS):
        t.append("▸" if name == v.knob else " ", style=DRAWN)
        short = {"temperature": "temp", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p"}[name]
        t.append(f"{short} ", style=LABEL)
        t.append(_fmt_setting(name, getattr(shown, name)), style=CHANGED if name in changes else "")
        if name in changes:
            t.append(f"@{changes[name] + 1}", style=CHANGED)
        t.append("  " if i % 2 == 0 else "\n")
    t.rstrip()
    return t


class LoopPanel(Static):
    """Redrawn at most once per frame, only when something it shows changed."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.border_title = "Loop"
        self.view: PanelView | None = None

    def show(self, view: PanelView) -> None:
        self.view = view
        view.width = max(30, self.content_size.width or view.width)
        self.update(panel_renderable(view))

    def on_resize(self) -> None:
        if self.view is not None:
            self.show(self.view)
