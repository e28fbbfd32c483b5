"""The turns of the transcript: blocks that render themselves to Strips.

Each turn is a *block* that renders itself to a list of Strips (one per screen line)
for the current width, and keeps them. The reply being generated only appends: each
frame wraps the few new tokens onto its open last line; lines that can no longer change
are frozen as Strips. So the cost of a frame depends on how many tokens arrived, not on
how long the reply or the transcript is. The `Transcript` widget (transcript.py) lays the
blocks out one under the other and draws the lines on screen.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Protocol

from rich.console import Console, RenderableType
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.strip import Strip

from loopchat.browser import key_here
from loopchat.chat.conversation import BLOCKING, ReplyRecord, finish_label
from loopchat.chat.pass_stats import reply_part
from loopchat.chat.plots import fmt_ms, fmt_rate, fmt_tokens, visible_controls
from loopchat.chat.prefs import Prefs
from loopchat.chat.views.panel_constraint import constraint_part
from loopchat.engine.repeats import longest_of
from loopchat.events import FinishReason, Step
from loopchat.tui.reply_markdown import reply_markdown
from loopchat.tui.token_styles import PassParity, depth_colour, token_style


class BlockHolder(Protocol):
    """What a block tells the widget that lays it out (the Transcript, transcript.py)
    when it changes: the blocks import nothing of it."""

    @property
    def content_width(self) -> int: ...

    def block_changed(self, block: Block) -> None: ...

    def block_grew(self, block: Block, first_changed: int) -> None: ...

    def reflow(self) -> None: ...


_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_REPLY = Style(color="#d7875f")
_USER = Style(color="#5f87d7")
_DIM = Style(color="#8a8a8a", italic=True)
_WAIT = Style(color="#87afd7", italic=True)
_WARN = Style(color="#ffaf5f", italic=True)
_ERROR = Style(color="#ff5f5f")
GUTTER = 2  # "│ " before every body line


def _clickable(style: Style | None, reply: int, step: int) -> Style:
    return (style or Style()) + Style.from_meta({"token": (reply, step)})


# ------------------------------------------------------------------ blocks ----
#: An empty line: one shared Strip, so the transcript's caches (keyed by the strip) keep it.
_BLANK_LINE = Strip.blank(0)


class Block:
    """One turn of the transcript, rendered to Strips for a given width."""

    #: completion mode's document (document_block.py): one block the transcript replaces
    whole_document = False

    def __init__(self) -> None:
        self.transcript: BlockHolder | None = None
        self.lines: list[Strip] = []
        self.width = 0

    @property
    def height(self) -> int:
        return len(self.lines)

    def line(self, i: int) -> Strip:
        return self.lines[i]

    def render(self, console: Console, width: int) -> None:
        self.width = width
        self.lines = list(self._render(console, width))

    def _render(self, console: Console, width: int) -> Iterable[Strip]:
        return ()

    def changed(self) -> None:
        """Re-render after a change (selection, preferences, finishing)."""
        if self.transcript is not None:
            self.transcript.block_changed(self)

    # helpers ------------------------------------------------------------------
    @staticmethod
    def _title(console: Console, label: str, style: Style, width: int) -> Strip:
        text = Text(f"╭─ {label} ", style=style)
        text.append("─" * max(0, width - text.cell_len), style=style + Style(dim=True))
        text.truncate(width)
        return Strip(list(text.render(console)), text.cell_len)

    def _body(self, console: Console, renderable: RenderableType, width: int, style: Style) -> list[Strip]:
        inner = max(1, width - GUTTER)
        lines = console.render_lines(renderable, console.options.update(width=inner, height=None), pad=False)
        return [self._gutter(Strip(segs), style) for segs in lines]

    @staticmethod
    def _gutter(strip: Strip, style: Style) -> Strip:
        return Strip([Segment("│ ", style), *strip], strip.cell_length + GUTTER)

    @staticmethod
    def _blank() -> Strip:
        return _BLANK_LINE


class UserBlock(Block):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def _render(self, console: Console, width: int) -> Iterable[Strip]:
        yield self._blank()
        yield self._title(console, "You", _USER, width)
        yield from self._body(console, Text(visible_controls(self.text)), width, _USER)


class ReplyView(Block):
    """One assistant reply: title, body (tokens, or Markdown once done), info line.

    While streaming, `add_steps` appends tokens to the open last line (`_tail`) and
    freezes the lines above it: a frame costs the new tokens, not the reply so far.
    """

    def __init__(self, record: ReplyRecord, prefs: Prefs) -> None:
        super().__init__()
        self.record = record
        self.prefs = prefs
        self.selected: int | None = None
        self._frozen: list[Strip] = []  # finished body lines of the live reply
        self._tail = Text()  # the open last line of the live reply
        self._tail_segs: list[Segment] = []  # the open line, rendered
        self._tail_strip: Strip | None = None
        self._n_tokens = 0  # tokens appended (for boundary parity)
        self.passes = PassParity()  # F6 by pass: the shade of the pass of each token appended
        self._status: Text | None = None
        self._console: Console | None = None
        #: step mode: the loop is stopped before a draw, waiting for the user (no spinner)
        self.step_stopped = False

    # ---- what a test or the app reads -------------------------------------------
    def body_text(self) -> str:
        """The reply text as shown (empty while a blocking reply is pending)."""
        r = self.record
        if r.mode == BLOCKING and not r.done:
            return str(self._status or "")
        if not r.done:
            return "".join(s.text for s in r.steps if not s.is_stop)
        return r.text

    def info_text(self) -> Text:
        r = self.record
        f = r.finish
        if f is None:
            return Text(f"error: {r.error}" if r.error else "", style=_ERROR)
        mode = "blocking" if r.mode == BLOCKING else "streamed"
        parts = [mode]
        # a remote server that is not loopchat: the times are the client's; what it does not send is not given
        server = r.start.source if r.start is not None else ""
        client = bool(server) and (r.steps[0].forward_ms is None if r.steps else r.prefill is None)
        if server:
            parts[0] += " from " + server
        if r.mode == BLOCKING:
            first = "not given" if client or f.ttft_ms is None else fmt_ms(f.ttft_ms)
            parts.append(f"whole reply shown after {fmt_ms(f.total_ms)} (model's first token at {first})")
        else:
            if f.completion_tokens or (f.completion_tokens is None and f.steps):
                parts.append(f"TTFT {fmt_ms(f.ttft_ms)}" if f.ttft_ms is not None else "TTFT not given")
            parts.append(f"total {fmt_ms(f.total_ms)}")
        parts.append(fmt_tokens(f.completion_tokens) if f.completion_tokens is not None else "tokens not given")
        if f.tokens_per_s:
            parts.append(fmt_rate(f.tokens_per_s) + (" arriving" if client else ""))
        if client:
            if f.prefill_ms is None:
                parts.append("prefill, forward and sampling times not given")
            else:
                parts.append(f"prefill {fmt_ms(f.prefill_ms)} (server's) · forward and sampling times not given")
        label = finish_label(f)
        style = _DIM
        if f.reason in (FinishReason.CANCELLED, FinishReason.ERROR):
            style = _WARN
            label = f"{label} ({f.reason.value})" + (f": {f.error}" if f.error else "")
        parts.append(label)
        if (shaped := constraint_part(r.steps, f)) is not None:
            parts.append(shaped)  # a grammar or schema: forced passes, forbidden mass
        if (spec := reply_part(r.own_steps)) is not None:
            parts.append(spec)  # a draft: tokens per pass, drafts kept (pass_stats.py)
        if (rep := longest_of((s.index, s.repeat) for s in r.steps)) is not None:
            parts.append(rep.describe())  # the reply repeated itself (repeats.py)
        if r.is_branch and r.prefill is not None:
            p = r.prefill  # a branch: how much of the context the KV cache still held
            parts.append(
                f"branch: {p.reused_tokens:,} tokens reused from the KV cache, {p.evaluated_tokens:,} evaluated"
            )
        if f.paused_ms:
            parts.append(f"stopped {fmt_ms(f.paused_ms)} in step mode (in total, not in TTFT or tok/s)")
        elif r.stepped:  # a trace from before Finish.paused_ms
            parts.append("stepped: TTFT, total and tok/s include the step-mode stops")
        if r.note:
            parts.append(r.note)
        if len(r.siblings) > 1:
            parts.append("other versions: Alt+PgUp / Alt+PgDn")
        return Text(" · ".join(parts), style=style)

    def _title_label(self) -> str:
        r = self.record
        title = self._title_head()
        if r.replay_of is not None:
            title += f" · replay of reply {r.replay_of} in {'blocking' if r.mode == BLOCKING else 'streaming'} mode"
        k, n = r.version
        if n > 1:
            title += f" · version {k}/{n}"
        if r.branch_from is not None and r.branch_at is not None:
            title += f" · from reply {r.branch_from} at token {r.branch_at + 1}"
        elif r.branch_at is not None:
            title += f" · branched at token {r.branch_at + 1}"
        return title

    def _title_head(self) -> str:
        # (a completion-mode continuation outside the document: an F9 replay of one)
        return f"{'Continuation' if self.record.is_document else 'Assistant'} · reply {self.record.number}"

    def shows(self, reply: int) -> bool:
        """This view shows tokens of reply number `reply`."""
        return self.record.number == reply

    def _markdown_ok(self) -> bool:
        """A finished reply may be shown as Markdown (F4)."""
        return self.prefs.markdown and self.selected is None and bool(self.record.text.strip())

    def _style_of(self, step: Step, n: int, selected: bool) -> Style | None:
        """The style of a reply's token (its `n`th shown)."""
        rec = self.record
        lens = None
        if self.prefs.lens_colours and step.index in rec.lens_depths:
            lens = depth_colour(rec.lens_depths[step.index], rec.lens_layers)
        return token_style(step, self.passes.of(step) if self.prefs.token_passes else n, self.prefs, selected, lens)

    def _live_text(self) -> Text:
        """What a live reply shows so far (re-wrapped on a resize, a selection...)."""
        return self._styled_text() if self.record.mode != BLOCKING else Text()

    # ---- rendering ------------------------------------------------------------------
    @property
    def height(self) -> int:
        if self.record.done or self._console is None:
            return len(self.lines)
        return 2 + len(self._frozen) + 1 + (1 if self._status is not None else 0)

    def line(self, i: int) -> Strip:
        if self.record.done or self._console is None:
            return self.lines[i]
        if i == 0:
            return self._blank()
        if i == 1:
            return self.lines[1]
        i -= 2
        if i < len(self._frozen):
            return self._frozen[i]
        if i == len(self._frozen):
            if self._tail_strip is None:
                # what _line_strip(self._tail) gives, from the segments kept as it grew
                self._tail_strip = self._gutter(Strip(self._tail_segs), _REPLY)
            return self._tail_strip
        status = (self._status or Text()).copy()
        status.truncate(max(1, self.width - GUTTER), overflow="ellipsis")  # one line: cut with "…"
        return self._line_strip(status)

    def _line_strip(self, text: Text) -> Strip:
        assert self._console is not None
        segs = list(text.render(self._console))
        return self._gutter(Strip(segs), _REPLY)

    def render(self, console: Console, width: int) -> None:
        self.width = width
        self._console = console
        if self.record.done:
            self.lines = list(self._render_done(console, width))
            return
        self.lines = [self._blank(), self._title(console, self._title_label(), _REPLY, width)]
        # live: re-wrap everything so far (a resize, a selection, a preference)
        self._frozen, self._tail, self._tail_segs, self._tail_strip = [], Text(), [], None
        self._append(self._live_text())
        self._update_status()

    def _render_done(self, console: Console, width: int) -> Iterable[Strip]:
        r = self.record
        yield self._blank()
        yield self._title(console, self._title_label(), _REPLY, width)
        if self._markdown_ok():
            body: RenderableType = reply_markdown(r.text)
        else:
            body = self._styled_text()
            body.rstrip()
            if not body.plain:
                body = Text("(no text)", style=_DIM) if r.finish is not None else Text("")
        yield from self._body(console, body, width, _REPLY)
        yield from self._body(console, self.info_text(), width, _REPLY)

    def _styled_text(self) -> Text:
        text, n, self.passes = Text(), 0, PassParity()
        number = self.record.number
        for step in self.record.steps:
            if step.is_stop or not step.text:
                continue
            style = self._style_of(step, n, step.index == self.selected)
            text.append(step.text, _clickable(style, number, step.index))
            n += 1
        if not self.record.steps and self.record.finish is not None:
            text.append(self.record.finish.text)  # a trace without steps
        self._n_tokens = n
        return text

    def _append(self, text: Text) -> None:
        """Add text to the open line; freeze the lines that wrapping has closed."""
        if not text:
            return
        console = self._console
        assert console is not None
        tail = self._tail
        inner = max(1, self.width - GUTTER)
        self._tail_strip = None
        if "\n" not in text.plain and tail.cell_len + text.cell_len <= inner:
            # it fits on the open line: wrapping would leave the line as it is, and
            # each token is its own span, so only the new ones need rendering
            if not tail:
                self._tail_segs = []  # an empty Text renders as one empty segment
            tail.append_text(text)
            self._tail_segs.extend(text.render(console))
            return
        tail.append_text(text)
        wrapped = tail.wrap(console, inner, overflow="fold")
        if len(wrapped) > 1:
            for line in wrapped[:-1]:
                self._frozen.append(self._line_strip(line))
            self._tail = wrapped[-1]
        self._tail_segs = list(self._tail.render(console))

    def _update_status(self) -> None:
        r = self.record
        if r.done:
            self._status = None
            return
        elapsed = time.monotonic() - r.started_at if r.started_at else 0.0
        frame = _SPINNER[int(elapsed * 10) % len(_SPINNER)]
        if self.step_stopped and (r.mode == BLOCKING or self._n_tokens == 0):
            # nothing runs: the loop waits for a key (a spinner and a clock would say it works)
            what = (
                "before a draw (blocking mode: the reply shows when complete)"
                if r.mode == BLOCKING
                else "before the first draw"
            )
            self._status = Text(f"step mode: stopped {what} · Enter draws, {key_here('f12')} runs freely", style=_WAIT)
        elif r.mode == BLOCKING:
            self._status = Text(f"{frame} waiting for the whole reply (blocking mode) · {elapsed:.1f} s", style=_WAIT)
        elif not any(s.text and not s.is_stop for s in r.steps):
            phase = "reading the prompt (prefill)" if r.prefill is None else "first token…"
            self._status = Text(f"{frame} {phase} · {elapsed:.1f} s", style=_WAIT)
        else:
            self._status = None

    # ---- live updates (once per frame) -------------------------------------------------
    def add_steps(self, steps: list[Step]) -> None:
        """Streaming: append the new tokens' text."""
        if self._console is None or self.record.mode == BLOCKING or self.selected is not None:
            return
        text = Text()
        number = self.record.number
        for step in steps:
            if step.is_stop or not step.text:
                continue
            style = self._style_of(step, self._n_tokens, False)
            text.append(step.text, _clickable(style, number, step.index))
            self._n_tokens += 1
        if self.record.shown_at is None and self._n_tokens:
            self.record.shown_at = time.monotonic()
        first_changed = 2 + len(self._frozen)  # the open line: everything above is frozen
        self._append(text)
        self._update_status()
        if self.transcript is not None:
            self.transcript.block_grew(self, first_changed)

    def tick(self) -> None:
        """Blocking mode (and before the first token): spinner and elapsed time."""
        if self.record.done or self._console is None:
            return
        self._update_status()
        if self.transcript is not None:
            self.transcript.block_grew(self, 2 + len(self._frozen))

    def finish(self) -> None:
        self._status = None
        r = self.record
        plain = not self._markdown_ok()
        if (
            plain
            and self._console is not None
            and r.mode != BLOCKING
            and self.selected is None
            and r.steps
            and self.transcript is not None
            and self.width == self.transcript.content_width
        ):
            # The live lines are already the plain rendering: keep them (re-wrapping a
            # long reply would stall the UI at the end), add the info line.
            tail = self._tail
            tail.rstrip()
            body = self._frozen + ([self._line_strip(tail)] if tail.plain else [])
            while body and not body[-1].cell_length > GUTTER:
                body.pop()
            info = self._body(self._console, self.info_text(), self.width, _REPLY)
            self.lines = [self._blank(), self._title(self._console, self._title_label(), _REPLY, self.width)]
            self.lines += body + info
            self.transcript.reflow()
            return
        self.changed()

    def rebuild(self) -> None:
        self.changed()

    def select(self, step_index: int | None, reply: int | None = None) -> None:
        """Show step `step_index` (of this view's reply `reply`) selected; None: none."""
        if step_index != self.selected:
            self.selected = step_index
            self.changed()
