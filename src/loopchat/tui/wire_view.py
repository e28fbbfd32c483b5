"""The wire view: the loop panel's place, switched with F10, showing the reply's last
steps as the SSE lines they are on the wire (a remote backend: as received) or would be
(the local engine: as `loopchat serve` would send them, wire_feed.py), with chunks/s
and bytes/s over the reply.

Streaming, the newest event is at the bottom and each new chunk pushes the older ones
up; blocking, the view waits (with the time it has waited) for the one response body,
then shows it from its start. Each event gets a note row (the pass it carries, when it
was sent or received, its bytes) and its text cut into rows at the view's width
(wire_lines.py). A click folds / unfolds the long values (the `loopchat` extension,
`top_logprobs`); the mouse wheel scrolls. A selected token (Alt+←/→) shows its chunk,
highlighted.

Cheap per frame: the serializer is fed only while the view is shown, with the new
steps only; an event's rows are made once (per width and fold); a frame walks back from
the newest event only as far as the rows that fit.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from typing import Any

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.message import Message
from textual.widget import Widget

from loopchat.chat.conversation import BLOCKING, ReplyRecord, finish_label
from loopchat.chat.pass_stats import pass_of_token
from loopchat.chat.plots import fmt_ms
from loopchat.chat.wire_feed import ReplyWire, WireEntry
from loopchat.tui.fast_static import FastStatic, Line, text_to_lines
from loopchat.tui.wire_lines import NOTE, Row, event_rows

HEAD = Style.parse("bold #87d7ff")
LABEL = Style.parse("#8a8a8a")
_GENERATING = Style.parse("#5fd75f")
_SELECTED = Style.parse("bold #ffaf00")
_WAIT = Style.parse("italic #ffd75f")
_WELCOME = Style.parse("#bcbcbc")
_HINT = Style.parse("dim")
_HIGHLIGHT = Style(bgcolor="#3a3a3a")
_RULE = Style.parse("#444444")
_NONE = Style()

#: Replies whose wire is kept (a serializer and its lines); older ones are made again.
KEEP_REPLIES = 4
#: Events whose screen rows are kept (their size: docs/performance.md, "A step on its
#: way to the UI"); the rows of older ones are made again if they are shown again.
KEEP_ROWS = 128
#: Mouse wheel: rows per notch.
SCROLL_ROWS = 3

_WELCOME_TEXT = (
    "The wire: what a streaming API sends for each pass of the loop, one server-sent "
    "event per token. Send a message to see the chunks; F10 goes back to the loop panel."
)


def fmt_bytes(n: int) -> str:
    return f"{n:,} B"


def fmt_byte_rate(per_s: float) -> str:
    for unit, scale in (("MB/s", 1e6), ("kB/s", 1e3)):
        if per_s >= scale:
            return f"{per_s / scale:.1f} {unit}"
    return f"{per_s:.0f} B/s"


def fmt_chunk_rate(per_s: float) -> str:
    return f"{per_s:.0f} chunks/s" if per_s >= 9.95 else f"{per_s:.1f} chunks/s"


def _pieces_rows(pieces: list[tuple[str, Style]], width: int) -> list[Line]:
    """One logical line word-wrapped to `width` as rich prints it (at once if it fits)."""
    if sum(len(p) if p.isascii() else cell_len(p) for p, _ in pieces) <= width:
        return [tuple(pieces)]
    t = Text()
    for s, style in pieces:
        t.append(s, style)
    return text_to_lines(t, width)


class WireView(Widget):
    """Redrawn at most once per frame while shown, only when what it shows changed."""

    DEFAULT_CSS = """
    WireView {
        width: 50%;
        min-width: 52;
        height: 100%;
        border: round $primary 60%;
        border-title-color: $text-primary;
        padding: 0 1;
    }
    WireView > FastStatic {
        width: 100%;
        height: 100%;
    }
    Screen.-narrow WireView {
        width: 100%;
        min-width: 0;
        height: 40%;
        min-height: 10;
    }
    """
    SCOPED_CSS = False  # the narrow rule matches the screen's class

    class FoldToggled(Message):
        """The user clicked the view: fold / unfold the long values."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.border_title = "Wire"
        self.body = FastStatic()
        self.fold = True
        self.scrolled = 0  # rows scrolled away from the anchor (the newest event / the body's start)
        self._wires: OrderedDict[ReplyRecord, ReplyWire] = OrderedDict()
        self._args: tuple | None = None
        self._key: tuple | None = None
        self._record: ReplyRecord | None = None
        self._with_rows: deque[WireEntry] = deque()  # the entries holding rows, oldest first

    def compose(self) -> ComposeResult:
        yield self.body

    @property
    def text(self) -> Text:
        """What the view shows, as one Text."""
        return self.body.render()

    def wire_of(self, rec: ReplyRecord) -> ReplyWire:
        w = self._wires.get(rec)
        if w is None:
            w = self._wires[rec] = ReplyWire(rec)
            while len(self._wires) > KEEP_REPLIES:
                self._wires.popitem(last=False)
        else:
            self._wires.move_to_end(rec)
        return w

    @property
    def replies_kept(self) -> int:
        """Replies whose wire is held (serialized lines, received texts)."""
        return len(self._wires)

    @property
    def needs_frames(self) -> bool:
        """Something shown changes with time alone: a wait's clock, steps to catch up."""
        rec = self._record
        if rec is None:
            return False
        w = self._wires.get(rec)
        return w is None or w.pending_steps > 0 or w.waiting or (not rec.done and rec.mode == BLOCKING)

    def forget(self) -> None:
        """A new conversation: its replies are gone."""
        self._wires.clear()
        self._with_rows.clear()
        self._record = None
        self._key = None

    # ------------------------------------------------------------------ drawing ----
    def show(self, rec: ReplyRecord | None, selected: int | None = None, generating: bool = False) -> None:
        """Show the wire of `rec` (None: no reply yet); `selected`: a selected token's
        step index (its chunk is shown, highlighted)."""
        self._args = (rec, selected, generating)
        if rec is not self._record:
            self.scrolled = 0
            self._record = rec
        width = max(20, self.content_size.width or 48)
        height = self.content_size.height or 30
        if rec is None:
            key: tuple = (None, width, height)
            if key != self._key:
                self._key = key
                self.body.set_lines(self._welcome(width))
            return
        w = self.wire_of(rec)
        w.sync()
        waited = None
        if w.waiting or (not rec.done and not w.stream):
            waited = round(time.monotonic() - rec.started_at, 1) if rec.started_at else None
        key = (
            rec,
            len(w.entries),
            w.pending_steps,
            w.remote,
            rec.done,
            generating,
            selected,
            width,
            height,
            self.fold,
            self.scrolled,
            waited,
            len(rec.steps) if waited is not None else 0,
        )
        if key == self._key:
            return
        self._key = key
        head = self._header(rec, w, width, height, selected, generating, waited)
        rows = self._rows(w, width, max(0, height - len(head)), selected)
        self.body.set_lines(head + rows)

    def redraw(self) -> None:
        self._key = None
        if self._args is not None:
            self.show(*self._args)

    def _welcome(self, width: int) -> list[Line]:
        out: list[Line] = []
        out.extend(_pieces_rows([("The loop on the wire", HEAD)], width))
        out.append(())
        out.extend(_pieces_rows([(_WELCOME_TEXT, _WELCOME)], width))
        return out

    def _header(
        self,
        rec: ReplyRecord,
        w: ReplyWire,
        width: int,
        height: int,
        selected: int | None,
        generating: bool,
        waited: float | None,
    ) -> list[Line]:
        lines: list[list[tuple[str, Style]]] = []
        mode = "streaming" if w.stream else "blocking"
        title: list[tuple[str, Style]] = [(f"Reply {rec.number} · {mode}", HEAD)]
        if selected is not None:
            title.append((f" · chunk of {pass_of_token(rec.steps, selected)} (selected token)", _SELECTED))
        elif generating and not rec.done:
            title.append((" · generating", _GENERATING))
        elif rec.finish is not None:
            title.append((f" · done: {finish_label(rec.finish)}", LABEL))
        elif rec.error:
            title.append((f" · ended: {rec.error}", LABEL))
        lines.append(title)
        short = height < 12  # a short view (under a narrow transcript): the figures only
        if not short:
            lines.append([(self._source(w), LABEL)])
        lines.append(self._figures(rec, w, waited))
        if height >= 16:
            hint = "long values folded · click: whole lines" if self.fold else "whole lines · click: fold long values"
            lines.append([(hint + " · wheel scrolls", _HINT)])
        out: list[Line] = []
        for pieces in lines:
            out.extend(_pieces_rows(pieces, width))
        if not short:
            out.append(())
        return out

    @staticmethod
    def _source(w: ReplyWire) -> str:
        if w.remote:
            return f"as received from {w.source or 'the server'} · " + (
                "SSE stream" if w.stream else "one response body"
            )
        o = w.request
        if o is None:  # nothing yet tells where the reply comes from
            return "request sent · " + ("stream" if w.stream else "no stream: one body")
        path = "/v1/chat/completions" if o.chat else "/v1/completions"
        kind = "stream" if o.stream else "no stream: one body"
        lp = f"logprobs top {o.top_logprobs}" if o.chat else f"logprobs {o.top_logprobs}"
        return f"as loopchat serve would send it · {path} · {kind} · {lp} · usage"

    @staticmethod
    def _figures(rec: ReplyRecord, w: ReplyWire, waited: float | None) -> list[tuple[str, Style]]:
        if w.pending_steps:
            done = len(rec.steps) - w.pending_steps
            return [(f"serializing the reply: {done:,} of {len(rec.steps):,} steps…", _WAIT)]
        if not w.stream and not rec.done:
            n = len(rec.steps)
            return [
                (f"waiting for the response body… {waited or 0:.1f} s", _WAIT),
                # the local loop runs (and is counted) while the body waits for its end
                (f" · {n} pass{'es' if n != 1 else ''} run, nothing sent yet" if w.request else "", LABEL),
            ]
        if w.waiting:
            return [(f"waiting for the first chunk… {waited or 0:.1f} s", _WAIT)]
        if w.remote and not w.entries:
            return [("no bytes recorded for this reply (a trace keeps its events, not the wire)", LABEL)]
        if w.cancelled and not w.stream:
            return [("stopped before the body: the client closed the connection, nothing was sent", LABEL)]
        s = w.stats
        bodies = [e for e in w.entries[-1:] if e.body]
        if bodies and not s.chunks:
            e = bodies[0]
            at = f" · at {fmt_ms(e.t_ms)}" if e.t_ms is not None else ""
            return [(f"one body · {fmt_bytes(e.nbytes)}{at}", _NONE)]
        out: list[tuple[str, Style]] = [(f"{s.chunks:,} chunks · {fmt_bytes(s.nbytes)}", _NONE)]
        cps, bps = s.chunks_per_s, s.bytes_per_s
        if cps is None or bps is None:
            out.append((" · rate: not measured yet" if not rec.done else " · rate: not measured", LABEL))
        else:
            out.append((f" · {fmt_chunk_rate(cps)} · {fmt_byte_rate(bps)}", _NONE))
            out.append((" so far" if not rec.done else f" over {fmt_ms(s.seconds * 1000)}", LABEL))
        if w.cancelled:
            out.append((" · stopped: the client closed the connection, nothing more was sent", LABEL))
        return out

    def _entry_rows(self, e: WireEntry, width: int) -> list[Row]:
        cached = e.rows
        if cached is not None and cached[0] == width and cached[1] == self.fold:
            return cached[2]
        rows = [self._note(e, width), *event_rows(e.text, width, self.fold)]
        if cached is None:
            kept = self._with_rows
            kept.append(e)
            if len(kept) > KEEP_ROWS:
                kept.popleft().rows = None
        e.rows = (width, self.fold, rows)
        return rows

    @staticmethod
    def _note(e: WireEntry, width: int) -> Row:
        parts = [e.label]
        if e.t_ms is not None:
            parts.append(f"at {fmt_ms(e.t_ms)}")
        parts.append(fmt_bytes(e.nbytes))
        s = "─ " + " · ".join(parts) + " "
        return ((s[:width], NOTE), ("─" * (width - len(s)), _RULE)) if len(s) < width else ((s[:width], NOTE),)

    def _rows(self, w: ReplyWire, width: int, height: int, selected: int | None) -> list[Line]:
        entries = w.entries
        if not entries or height <= 0:
            return []
        if len(entries) == 1 and entries[0].body:  # a body: from its start
            rows = self._entry_rows(entries[0], width)
            self.scrolled = max(0, min(self.scrolled, len(rows) - height))
            return list(rows[self.scrolled : self.scrolled + height])
        sel = w.entry_of_step(selected) if selected is not None else None
        last = sel if sel is not None else len(entries) - 1
        need = height + self.scrolled
        got: list[list[Row]] = []
        n = 0
        i = last
        while i >= 0 and n < need:
            rows = self._entry_rows(entries[i], width)
            if i == sel:
                rows = [tuple((s, style + _HIGHLIGHT) for s, style in r) for r in rows]
            got.append(rows)
            n += len(rows)
            i -= 1
        flat: list[Line] = [r for rows in reversed(got) for r in rows]
        if sel is not None and self.scrolled == 0 and len(got[0]) > height:
            return flat[len(flat) - len(got[0]) :][:height]  # a tall selected chunk: its start
        self.scrolled = max(0, min(self.scrolled, len(flat) - height))
        end = len(flat) - self.scrolled
        return flat[max(0, end - height) : end]

    # ------------------------------------------------------------------ input ----
    def on_click(self, event: events.Click) -> None:
        event.stop()
        if event.chain == 1:  # a double click is one click, not two toggles
            self.post_message(self.FoldToggled())

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()
        self._scroll(SCROLL_ROWS)

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        self._scroll(-SCROLL_ROWS)

    def _scroll(self, rows: int) -> None:
        """Scroll `rows` up: towards older events (a body: towards its start)."""
        w = self._wires.get(self._record) if self._record is not None else None
        body = w is not None and len(w.entries) == 1 and w.entries[0].body
        self.scrolled = max(0, self.scrolled + (-rows if body else rows))
        self.redraw()

    def on_resize(self) -> None:
        self.redraw()


__all__ = ["WireView", "fmt_byte_rate", "fmt_bytes", "fmt_chunk_rate"]
