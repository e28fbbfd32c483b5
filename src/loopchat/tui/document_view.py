"""The document view (Ctrl+T): the transcript's place shows the exact text the model
reads for one reply, token by token; a cursor (←/→, ↑/↓, PgUp/PgDn, Home/End) walks the
tokens and the line at the bottom names the one under it.

What it shows is made without Textual in chat/views/ (document.py: the rows and the
status line; document_header.py: the header); this module is the widgets: the body is a
line-API scroll view that turns only the rows on screen into Strips, keeps them, and on a
cursor move repaints the rows of the two tokens concerned, so a 4,000-token context
scrolls at the cost of one screen; a live reply only appends its new steps' tokens.
"""

from __future__ import annotations

from typing import Any

from rich.segment import Segment
from textual.app import ComposeResult
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget

from loopchat.chat.conversation import ReplyRecord
from loopchat.chat.views.document import (
    _FG,
    CONTROL,
    PREFIX,
    PROMPT,
    REPLY,
    REPLY_MARK,
    STOP,
    TEXT,
    VISIBLE,
    DocToken,
    DocumentLayout,
    DocumentLines,
    lay_out,
    shown_form,
    status_line,
)
from loopchat.chat.views.document_header import SHORT_VIEW, header_lines, short_header
from loopchat.events import Prefill, Start
from loopchat.tui.fast_static import FastStatic
from loopchat.tui.prompt import TypedForTheBox
from loopchat.tui.step_mode import step_keys

#: rows PgUp / PgDn move the cursor when the view has no height yet
_PAGE = 20


class DocumentBody(ScrollView, can_focus=True):
    """The document's rows; only the rows on screen become Strips, kept until they change."""

    BINDINGS = [
        Binding("left", "move(-1)", "Previous token", show=False),
        Binding("right", "move(1)", "Next token", show=False),
        Binding("up", "row(-1)", "Line up", show=False),
        Binding("down", "row(1)", "Line down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "edge(0)", "First token", show=False),
        Binding("end", "edge(1)", "Last token", show=False),
        *step_keys(""),  # the loop stopped in step mode: Enter, n, 1–9 and / work here too
    ]

    DEFAULT_CSS = """
    DocumentBody {
        height: 1fr;
        padding: 0 1;
        scrollbar-size-vertical: 1;
        overflow-x: hidden;
        overflow-y: scroll;
    }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.doc = DocumentLines(80)
        self.cursor: int | None = None
        self._strips: dict[int, Strip] = {}
        #: a live reply's end is in view and stays there (also when the view gets shorter)
        self.follow_end = False
        self._key: tuple | None = None

    # ---- content --------------------------------------------------------------------
    def set_doc(self, doc: DocumentLines) -> None:
        self.doc = doc
        self._strips.clear()
        self._resize()
        self.refresh()

    def grew(self, first_row: int) -> None:
        """Rows from `first_row` on changed or were added (a live reply's new tokens)."""
        for r in [r for r in self._strips if r >= first_row]:
            del self._strips[r]
        self._resize()
        self._refresh_rows(first_row, self.doc.height)

    def _resize(self) -> None:
        size = Size(self.doc.width, self.doc.height)
        if size != self.virtual_size:
            self.virtual_size = size

    def _refresh_rows(self, first: int, last: int) -> None:
        y0 = self.scroll_offset.y
        view = self.scrollable_content_region
        top, bottom = max(0, first - y0), min(last + 1 - y0, view.height)
        if bottom > top:
            self.refresh(Region(0, top, view.width, bottom - top))

    @property
    def text_width(self) -> int:
        return max(4, self.scrollable_content_region.width or self.size.width or 80)

    # ---- cursor ---------------------------------------------------------------------
    def set_cursor(self, index: int | None, scroll: bool = True) -> None:
        tokens = self.doc.tokens
        if index is not None and tokens:
            index = max(0, min(index, len(tokens) - 1))
        elif not tokens:
            index = None
        old, self.cursor = self.cursor, index
        for i in (old, index):
            if i is not None and i < len(tokens):
                t = tokens[i]
                for r in range(t.first_row, t.last_row + 1):
                    self._strips.pop(r, None)
                self._refresh_rows(t.first_row, t.last_row)
        if scroll and index is not None:
            self.reveal(tokens[index])
        if old != index and self.parent is not None:
            self.parent.cursor_moved()  # type: ignore[attr-defined]

    def reveal(self, t: DocToken) -> None:
        y0 = self.scroll_offset.y
        height = self.scrollable_content_region.height or 1
        if t.first_row < y0:
            self.scroll_to(y=t.first_row, animate=False, immediate=True)
        elif t.last_row >= y0 + height:
            self.scroll_to(y=max(t.first_row, t.last_row - height + 1), animate=False, immediate=True)

    def action_move(self, by: int) -> None:
        self.follow_end = False  # the user's cursor: the view goes where it goes
        if self.doc.tokens:
            self.set_cursor((self.cursor if self.cursor is not None else -by) + by)

    def _to_row(self, row: int, step: int) -> None:
        """The cursor to the token at its column on `row`, else the next row's in the
        direction `step` (+1 down, -1 up); past the document's edge: its first / last token."""
        i = self.doc.token_toward(self.cursor, row, step)
        if i is not None:
            self.set_cursor(i)

    def action_row(self, by: int) -> None:
        self.follow_end = False  # the user's cursor: the view goes where it goes
        if self.doc.tokens:
            cur = self.doc.tokens[self.cursor or 0]
            self._to_row(cur.last_row + 1 if by > 0 else cur.first_row - 1, 1 if by > 0 else -1)

    def action_page(self, by: int) -> None:
        self.follow_end = False  # the user's cursor: the view goes where it goes
        if self.doc.tokens:
            page = max(1, (self.scrollable_content_region.height or _PAGE) - 1)
            cur = self.doc.tokens[self.cursor or 0]
            self._to_row((cur.last_row if by > 0 else cur.first_row) + by * page, 1 if by > 0 else -1)

    def action_edge(self, end: int) -> None:
        self.follow_end = False  # the user's cursor: the view goes where it goes
        if self.doc.tokens:
            self.set_cursor(len(self.doc.tokens) - 1 if end else 0)

    def on_key(self, event: Any) -> None:
        # a message being typed: into the box; while the loop is stopped, the die's keys (bound above)
        if not self.app.session.stopped:  # type: ignore[attr-defined]
            TypedForTheBox.hand_over(event, self)

    # ---- step mode: the die's keys, while the loop is stopped (else they do nothing) ----
    def action_step_draw(self, n: int) -> None:
        if self.app.session.stopped:  # type: ignore[attr-defined]
            self.app.action_step_draw(n)  # type: ignore[attr-defined]

    def action_step_pick(self, rank: int) -> None:
        if self.app.session.stopped:  # type: ignore[attr-defined]
            self.app.action_step_pick(rank)  # type: ignore[attr-defined]

    def action_step_search(self) -> None:
        if self.app.session.stopped:  # type: ignore[attr-defined]
            self.app.action_step_search()  # type: ignore[attr-defined]

    # ---- drawing --------------------------------------------------------------------
    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()

    def on_resize(self, event: Any) -> None:
        if self.parent is not None:
            self.parent.width_changed(self.text_width)  # type: ignore[attr-defined]
        if self.follow_end:  # (e.g. the header got a line: the view one row shorter)
            self.scroll_to_end()

    def scroll_to_end(self) -> None:
        view_h = self.scrollable_content_region.height
        if view_h:
            self.scroll_to(y=max(0, self.doc.height - view_h), animate=False, immediate=True)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        base = self.visual_style.rich_style
        key = (width, base)
        if key != self._key:
            self._key = key
            self._strips.clear()
        row = scroll_y + y
        strip = self._strips.get(row)
        if strip is None:
            if row >= self.doc.height:
                return Strip.blank(width, base)
            segments = [Segment(s, base + style) for s, style in self.doc.line(row, self.cursor)]
            strip = Strip(segments).crop_extend(0, width, base)
            self._strips[row] = strip
        return strip


class DocumentView(Widget):
    """A header (the reply's prefill and context figures), the body, the cursor's line."""

    class StepUnderCursor(Message):
        """The cursor is on a token of a finished reply: step `step` of reply `reply`
        (the app shows that step in the loop panel, as a selected token)."""

        def __init__(self, reply: int, step: int) -> None:
            super().__init__()
            self.reply = reply
            self.step = step

    DEFAULT_CSS = """
    DocumentView {
        height: 1fr;
        layout: vertical;
    }
    DocumentView > #doc-head {
        height: auto;
        padding: 0 1;
        background: $boost;
    }
    DocumentView > #doc-status {
        height: 1;
        padding: 0 1;
        background: $boost;
    }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.head = FastStatic(fit=True, id="doc-head")  # as high as its lines
        self.body = DocumentBody(id="doc-body")
        self.status = FastStatic(id="doc-status")
        self.record: ReplyRecord | None = None
        #: the rows shown, where the reply starts, the steps laid out so far (chat/views/document.py)
        self.laid_out = DocumentLayout(self.body.doc)
        self._selected: int | None = None  # the transcript's selected step shown
        self._head_key: tuple | None = None
        # the Start and Prefill the rows were made from (a Prefill's prompt surprisals colour them)
        self._start: tuple[Start | None, Prefill | None] = (None, None)
        self._deferred = False  # rows to make once the body has its width
        self.return_focus: Widget | None = None  # what had the focus before Ctrl+T showed it
        #: step mode: the live reply's loop is stopped before the draw of this step (else None)
        self.stopped_before: int | None = None
        self._building = False

    def compose(self) -> ComposeResult:
        yield self.head
        yield self.body
        yield self.status

    def on_mount(self) -> None:
        self.cursor_moved()

    @property
    def doc(self) -> DocumentLines:
        return self.body.doc

    @property
    def reply_start(self) -> int:
        """The index of the reply's first token (its marker row is above it)."""
        return self.laid_out.reply_start

    @property
    def ready(self) -> bool:
        """Laid out at the view's width (not yet between Ctrl+T and the view's first layout)."""
        return not self._deferred

    @property
    def fallback(self) -> bool:
        """An older trace: the prompt as its text, no boundaries."""
        return self.laid_out.fallback

    @property
    def cursor_token(self) -> DocToken | None:
        c = self.body.cursor
        return self.doc.tokens[c] if c is not None and c < len(self.doc.tokens) else None

    # ---- what is shown ----------------------------------------------------------------
    def show(self, rec: ReplyRecord | None, selected: int | None = None) -> None:
        """Show the document of `rec` (None: no reply yet), laid out once, then only its
        new steps; `selected`: a step index to put the cursor on."""
        if rec is not self.record or (
            rec is not None and (rec.start is not self._start[0] or rec.prefill is not self._start[1])
        ):
            self.record = rec
            self._selected = None
            self._build()
        elif self._deferred:  # laid out whole once the body has its width
            pass
        elif rec is not None and len(rec.steps) > self.laid_out.steps:
            body = self.body
            first = self.doc.height - 1
            view_h = body.scrollable_content_region.height
            follow = body.scroll_offset.y + view_h >= self.doc.height  # the end was in view: it stays
            self.laid_out.add_steps(rec)
            body.grew(max(0, first))
            body.follow_end = follow and bool(view_h)
            if body.follow_end:
                body.scroll_to_end()
        if selected is not None and selected != self._selected:
            self._selected = selected
            self._cursor_on_step(selected)
        elif selected is None:
            self._selected = None
        self._header()

    def _build(self) -> None:
        rec = self.record
        if not self.body.size.width:  # just shown: laid out once its width is known (on_resize)
            self._deferred = True
            self._start = (rec.start, rec.prefill) if rec is not None else (None, None)
            return
        self._deferred = False
        self._building = True  # the cursor placed here is not the user's: no StepUnderCursor
        try:
            self._lay_out(rec)
            self.cursor_moved()
        finally:
            self._building = False
        self._header()

    def _lay_out(self, rec: ReplyRecord | None) -> None:
        layout = self.laid_out = lay_out(rec, self.body.text_width)
        self._start = (rec.start, rec.prefill) if rec is not None else (None, None)
        doc = layout.doc
        self.body.cursor = None
        self.body.follow_end = False
        self.body.set_doc(doc)
        if doc.tokens:
            first = min(layout.reply_start, len(doc.tokens) - 1)
            # a few rows of the prompt above the cursor, the reply's start below it (in a
            # view of few rows too: the rows after the cursor are the ones that grow)
            above = max(0, min(3, (self.body.scrollable_content_region.height or _PAGE) - 3))
            self.body.scroll_to(y=max(0, doc.tokens[first].first_row - above), animate=False, immediate=True)
            self.body.set_cursor(first, scroll=False)
        if self._selected is not None:
            self._cursor_on_step(self._selected)

    def _cursor_on_step(self, index: int) -> None:
        i = self.laid_out.step_at(index)
        if i is not None:
            self.body.set_cursor(i)

    def width_changed(self, width: int) -> None:
        if self._deferred or (width != self.doc.width and self.record is not None):
            cursor = self.body.cursor
            self._build()
            if cursor is not None:
                self.body.set_cursor(cursor)
        elif width != self.doc.width:
            self.laid_out = DocumentLayout(DocumentLines(width))
            self.body.set_doc(self.laid_out.doc)
        self._header()  # at the view's width (when it was first shown it had none yet: 80)

    # ---- header and status --------------------------------------------------------------
    def _header(self) -> None:
        rec = self.record
        short = short_header(self.size.height)
        key = (
            rec,
            self.head.content_size.width,
            short,
            self.fallback,
            rec is not None and rec.prefill,
            rec is not None and rec.trimmed,
            rec is not None and rec.done,
            rec is not None and len(rec.steps),
            self.stopped_before,
        )
        if key == self._head_key:
            return
        self._head_key = key
        stopped = self.stopped_before if rec is not None and not rec.done else None
        width = self.head.content_size.width or 80
        self.head.set_lines(header_lines(rec, self.fallback, width, stopped, short))

    def cursor_moved(self) -> None:
        t = self.cursor_token
        self.status.set_lines([status_line(t)])
        rec = self.record
        if (
            not self._building
            and t is not None
            and t.step is not None
            and rec is not None
            and rec.done
            and t.step.index != self._selected
        ):
            self._selected = t.step.index
            self.post_message(self.StepUnderCursor(rec.number, t.step.index))


#: the document's model, named here too (chat/views/document.py, document_header.py)
__all__ = [
    "CONTROL",
    "PREFIX",
    "PROMPT",
    "REPLY",
    "REPLY_MARK",
    "SHORT_VIEW",
    "STOP",
    "TEXT",
    "VISIBLE",
    "_FG",
    "DocToken",
    "DocumentBody",
    "DocumentLines",
    "DocumentView",
    "header_lines",
    "shown_form",
    "status_line",
]
