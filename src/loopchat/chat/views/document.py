"""The document view (Ctrl+T): the transcript's place shows the exact text the model
reads for one reply, token by token.

The model does not see messages: it continues one text, the chat template's rendering
with its control tokens. This view draws that text from the reply's Start event
(`prompt_token_texts`: what each prompt token adds; joined, the exact text, BOS
included), sets the template's control tokens apart (`prompt_special`), marks where the
reply begins and follows it with the reply's own tokens (its steps' texts). Token
boundaries are alternating backgrounds; a cursor (←/→, ↑/↓, PgUp/PgDn, Home/End) walks
the tokens and the line at the bottom names the one under it: `id · 'piece' · position`.
The header says how many tokens the prompt has, how many the prefill took from the KV
cache and how many it evaluated, and what the context policy dropped.

A trace from before `prompt_token_texts` was recorded: the prompt is shown as its text
(`Start.prompt_text`) with no boundaries, and the header says so.

Cheap: a reply's rows are made once for a width (`DocumentLines`) and a live reply only
appends its new steps' tokens; the body is a line-API scroll view that turns only the
rows on screen into Strips, keeps them, and on a cursor move repaints the rows of the
two tokens concerned, so a 4,000-token context scrolls at the cost of one screen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.app import ComposeResult
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget

from loopchat.chat.conversation import ReplyRecord
from loopchat.chat.plots import fmt_ms
from loopchat.events import Start, Step
from loopchat.token_faces import byte_face, partial_character
from loopchat.tui.fast_static import FastStatic, Line
from loopchat.tui.prompt import TypedForTheBox, visible_controls
from loopchat.tui.step_mode import step_keys

# token kinds
PROMPT = "prompt"  # text of the prompt (the template's words and the messages)
CONTROL = "control"  # a control token the chat template wrote (<|im_start|>, <bos>...)
PREFIX = "prefix"  # a branch: the reply's first tokens, chosen earlier (texts not recorded)
REPLY = "reply"  # a token the reply drew
STOP = "stop"  # the end-of-generation token that ended the reply
TEXT = "text"  # an older trace: the whole prompt as its text, no token boundaries

_BG = ("#262d38", "#36405a")  # alternating token backgrounds (as F6 for replies)
_FG = {
    PROMPT: Style(color="#d0d0d0"),
    CONTROL: Style(color="#ff87d7", bold=True),
    PREFIX: Style(color="#87afd7", italic=True),
    REPLY: Style(color="#ffaf5f"),
    STOP: Style(color="#ff87d7", bold=True),
    TEXT: Style(color="#d0d0d0"),
}
_CURSOR = Style(color="black", bgcolor="#ffaf00", bold=True)
_MARK = Style(color="#ffaf5f", bold=True)
_RULE = Style(color="#5f5f5f")
HEAD = Style.parse("bold #87d7ff")
LABEL = Style.parse("#8a8a8a")
_NOTE = Style.parse("italic #ffd75f")
_STATUS = Style.parse("#d0d0d0")
_STATUS_KEY = Style.parse("bold #ffaf00")

#: how a character that would not show is drawn (the others are drawn as they are)
VISIBLE = {"\n": "↵", "\t": "→", "\r": "␍"}
REPLY_MARK = "──▶ the reply begins here"
#: rows PgUp / PgDn move the cursor when the view has no height yet
_PAGE = 20
#: a view of fewer rows than this (80x24: the panel under it) has the short header
SHORT_VIEW = 16


def shown_form(text: str) -> str:
    """`text` as the view's rows show it once joined (DocumentLines.shown_text): each
    newline drawn as ↵ and a break, tabs as arrows, other controls as symbols (␍, ␛...)."""
    return visible_controls(text.replace("\n", "↵\n").replace("\t", "→"))


@dataclass(slots=True)
class DocToken:
    text: str  # what it adds to the document
    token_id: int | None
    kind: str
    position: int | None  # its place in the context (0 = the first token)
    step: Step | None = None  # a reply token's step
    first_row: int = 0
    last_row: int = 0


def _style(kind: str, index: int) -> Style:
    fg = _FG[kind]
    if kind == TEXT:
        return fg
    return fg + Style(bgcolor=_BG[index % 2])


class DocumentLines:
    """The document's rows at one width, made once; tokens are only appended.

    A row is a list of (text, style, token index) pieces; `hard[r]` says row r ends at a
    newline of the text (else the text wraps on to the next row); a marker row (the
    reply's start) is not part of the text."""

    def __init__(self, width: int) -> None:
        self.width = max(4, width)
        self.tokens: list[DocToken] = []
        self.rows: list[list[tuple[str, Style, int]]] = [[]]
        self.hard: list[bool] = [False]
        self.markers: set[int] = set()
        self._col = 0

    def add(self, token: DocToken) -> None:
        index = len(self.tokens)
        self.tokens.append(token)
        parts = [visible_controls(p.replace("\t", "→")) for p in token.text.split("\n")]
        if self._col >= self.width:
            self._new_row()
        elif self._col and parts[0]:  # a token that fits a row but not the rest of this one: on the next
            cells = len(parts[0]) if parts[0].isascii() else cell_len(parts[0])
            if self._col + cells > self.width >= cells:
                self._new_row()
        token.first_row = len(self.rows) - 1
        style = _style(token.kind, index)
        for k, part in enumerate(parts):
            if part:
                self._put(part, style, index)
            if k < len(parts) - 1:
                self._put("↵", style, index)
                self.hard[-1] = True
                self._new_row()
        if not token.text:  # nothing to show (a stop token's empty text): its piece
            self._put("∅", style, index)
        token.last_row = len(self.rows) - 1
        if self._col == 0 and len(self.rows) > 1 and not self.rows[-1]:
            token.last_row = len(self.rows) - 2  # its ↵ ended the row above

    def mark(self, label: str) -> None:
        """A marker row (not text): starts on a fresh row."""
        if self._col:
            self._new_row()
        self.rows[-1].append((label, _MARK, -1))
        self.markers.add(len(self.rows) - 1)
        self._new_row()

    def _new_row(self) -> None:
        self.rows.append([])
        self.hard.append(False)
        self._col = 0

    def _put(self, s: str, style: Style, index: int) -> None:
        width = self.width
        while s:
            room = width - self._col
            if room <= 0:
                self._new_row()
                room = width
            if s.isascii():
                chunk, s = s[:room], s[room:]
                cells = len(chunk)
            else:
                cells = 0
                n = 0
                for ch in s:
                    w = cell_len(ch)
                    if cells + w > room:
                        break
                    cells += w
                    n += 1
                if n == 0:
                    if self._col == 0:  # a wide character in a 1-cell view: take it anyway
                        n, cells = 1, cell_len(s[0])
                    else:
                        self._new_row()
                        continue
                chunk, s = s[:n], s[n:]
            self.rows[-1].append((chunk, style, index))
            self._col += cells

    @property
    def height(self) -> int:
        rows = len(self.rows)
        return rows - 1 if rows > 1 and not self.rows[-1] else rows

    def line(self, row: int, cursor: int | None) -> Line:
        return tuple((s, _CURSOR if i == cursor and i >= 0 else style) for s, style, i in self.rows[row])

    def shown_text(self) -> str:
        """The rows' texts joined as the document (marker rows left out, a wrapped row
        joined to the next): `shown_form(the document's text)`."""
        out = []
        for r in range(self.height):
            if r in self.markers:
                continue
            out.append("".join(s for s, _, _ in self.rows[r]))
            if self.hard[r]:
                out.append("\n")
        return "".join(out)

    def token_at(self, row: int, col: int) -> int | None:
        """The token drawn at (row, col), or the nearest on that row before it."""
        if not (0 <= row < len(self.rows)):
            return None
        best = None
        x = 0
        for s, _, i in self.rows[row]:
            if i >= 0:
                if best is None or x <= col:
                    best = i
            x += cell_len(s)
            if x > col and best is not None:
                break
        return best


def prompt_tokens(start: Start) -> list[DocToken]:
    ids = start.prompt_token_ids or ()
    texts = start.prompt_token_texts
    if texts and len(texts) == len(ids):
        special = set(start.prompt_special)
        return [DocToken(t, i, CONTROL if p in special else PROMPT, p) for p, (i, t) in enumerate(zip(ids, texts))]
    if start.prompt_text is not None:
        return [DocToken(start.prompt_text, None, TEXT, None)]
    return []


def step_token(start: Start | None, st: Step) -> DocToken:
    n_prompt = len(start.prompt_token_ids or ()) if start is not None else 0
    if st.is_stop:
        return DocToken(st.piece, st.token_id, STOP, n_prompt + st.index, st)
    return DocToken(st.text, st.token_id, REPLY, n_prompt + st.index, st)


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
        doc = self.doc
        if not doc.tokens:
            return
        cur = doc.tokens[self.cursor or 0]
        row = max(0, min(row, doc.height - 1))
        col = 0
        x = 0
        for s, _, i in doc.rows[cur.first_row]:
            if i == self.cursor:
                col = x
                break
            x += cell_len(s)
        while 0 <= row < doc.height:
            i = doc.token_at(row, col)
            if i is not None and i != self.cursor:
                self.set_cursor(i)
                return
            row += step
        self.set_cursor(len(doc.tokens) - 1 if step > 0 else 0)

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
        self.head = FastStatic(id="doc-head")
        self.body = DocumentBody(id="doc-body")
        self.status = FastStatic(id="doc-status")
        self.record: ReplyRecord | None = None
        self.reply_start = 0  # index of the reply's first token (its marker row is above it)
        self.fallback = False  # an older trace: the prompt as its text, no boundaries
        self._steps = 0  # the record's steps laid out so far
        self._selected: int | None = None  # the transcript's selected step shown
        self._head_key: tuple | None = None
        self._start: Start | None = None  # the Start the rows were made from
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
    def cursor_token(self) -> DocToken | None:
        c = self.body.cursor
        return self.doc.tokens[c] if c is not None and c < len(self.doc.tokens) else None

    # ---- what is shown ----------------------------------------------------------------
    def show(self, rec: ReplyRecord | None, selected: int | None = None) -> None:
        """Show the document of `rec` (None: no reply yet), laid out once, then only its
        new steps; `selected`: a step index to put the cursor on."""
        if rec is not self.record or (rec is not None and rec.start is not self._start):
            self.record = rec
            self._selected = None
            self._build()
        elif self._deferred:  # laid out whole once the body has its width
            pass
        elif rec is not None and len(rec.steps) > self._steps:
            body = self.body
            first = self.doc.height - 1
            view_h = body.scrollable_content_region.height
            follow = body.scroll_offset.y + view_h >= self.doc.height  # the end was in view: it stays
            for st in rec.steps[self._steps :]:
                self.doc.add(step_token(rec.start, st))
            self._steps = len(rec.steps)
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
            self._start = rec.start if rec is not None else None
            self._steps = len(rec.steps) if rec is not None else 0
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
        doc = DocumentLines(self.body.text_width)
        self.fallback = False
        self.reply_start = 0
        self._steps = 0
        self._start = rec.start if rec is not None else None
        if rec is not None and rec.start is not None:
            start = rec.start
            for t in prompt_tokens(start):
                doc.add(t)
            self.fallback = bool(doc.tokens) and doc.tokens[0].kind == TEXT
            doc.mark(
                REPLY_MARK
                + (f" (a branch: {len(start.reply_prefix)} tokens chosen earlier first)" if start.reply_prefix else "")
            )
            self.reply_start = len(doc.tokens)
            n_prompt = len(start.prompt_token_ids or ())
            # a branch in the chat holds the steps of its prefix (the reply it continues):
            # they are shown as steps; a trace without them, as the ids fed
            if not any(st.index < len(start.reply_prefix) for st in rec.steps):
                for k, tid in enumerate(start.reply_prefix):
                    doc.add(DocToken(f"⟨{tid}⟩", tid, PREFIX, n_prompt + k))
            for st in rec.steps:
                doc.add(step_token(start, st))
            self._steps = len(rec.steps)
        self.body.cursor = None
        self.body.follow_end = False
        self.body.set_doc(doc)
        if doc.tokens:
            first = min(self.reply_start, len(doc.tokens) - 1)
            # a few rows of the prompt above the cursor, the reply's start below it (in a
            # view of few rows too: the rows after the cursor are the ones that grow)
            above = max(0, min(3, (self.body.scrollable_content_region.height or _PAGE) - 3))
            self.body.scroll_to(y=max(0, doc.tokens[first].first_row - above), animate=False, immediate=True)
            self.body.set_cursor(first, scroll=False)
        if self._selected is not None:
            self._cursor_on_step(self._selected)

    def _cursor_on_step(self, index: int) -> None:
        for i in range(self.reply_start, len(self.doc.tokens)):
            st = self.doc.tokens[i].step
            if st is not None and st.index == index:
                self.body.set_cursor(i)
                return

    def width_changed(self, width: int) -> None:
        if self._deferred or (width != self.doc.width and self.record is not None):
            cursor = self.body.cursor
            self._build()
            if cursor is not None:
                self.body.set_cursor(cursor)
        elif width != self.doc.width:
            self.body.set_doc(DocumentLines(width))
        self._header()  # at the view's width (when it was first shown it had none yet: 80)

    # ---- header and status --------------------------------------------------------------
    def _header(self) -> None:
        rec = self.record
        short = 0 < self.size.height < SHORT_VIEW
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
        rows = len(self.head.lines)
        self.head.set_lines(header_lines(rec, self.fallback, self.head.content_size.width or 80, stopped, short))
        if len(self.head.lines) != rows:
            self.head.refresh(layout=True)  # its height is its number of lines

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


def header_lines(
    rec: ReplyRecord | None,
    fallback: bool,
    width: int,
    stopped: int | None = None,
    short: bool = False,
) -> list[Line]:
    """The view's header; `stopped`: the step the live reply's loop is stopped before;
    `short`: a view of few rows (80x24), which keeps them for the text: the title and the
    figures on one row, no "nothing dropped" and no legend."""
    from loopchat.tui.figure_rows import figure_rows

    rows: list[list[tuple[str, Style]]] = []
    if rec is None:
        rows.append(
            [("The text the model reads", HEAD), (" · no reply yet: send a message (Ctrl+T: back to the chat)", LABEL)]
        )
        return [r for p in rows for r in figure_rows(p, width)]
    start = rec.start
    if short:
        rows.append([(f"Reply {rec.number} as the model reads it", HEAD), (" (Ctrl+T: back) · ", LABEL)])
    else:
        rows.append([(f"Reply {rec.number} · the text the model reads", HEAD), (" · Ctrl+T: back to the chat", LABEL)])
    if start is None:
        rows.append([("waiting for the prompt…", _NOTE)])
        return [r for p in rows for r in figure_rows(p, width)]
    n_prompt = len(start.prompt_token_ids) if start.prompt_token_ids is not None else None
    parts: list[tuple[str, Style]] = rows.pop() if short else []
    if n_prompt is None:
        parts.append(("prompt: not given by the server", LABEL))
    else:
        control = len(start.prompt_special)
        parts.append((f"prompt {n_prompt:,} tokens" + (f" ({control} control)" if control else ""), _STATUS))
    p, f = rec.prefill, rec.finish
    if p is not None:
        parts.append((f" · KV cache: {p.reused_tokens:,} reused, {p.evaluated_tokens:,} evaluated", _STATUS))
    elif not rec.done:
        parts.append((" · prefill running…", _NOTE))
    elif f is not None and f.prefill_ms is not None:  # a server's own (llama.cpp's timings), as the panel shows it
        parts.append((f" · prefill {fmt_ms(f.prefill_ms)} (the server's timing)", _STATUS))
    else:
        parts.append((" · prefill: not recorded", LABEL))
    n_reply = sum(1 for s in rec.steps if not s.is_stop)
    parts.append((f" · reply {n_reply:,} tokens" + ("" if rec.done else " so far"), _STATUS))
    rows.append(parts)
    if stopped is not None:
        rows.append([(f"step mode: stopped before token {stopped + 1}, drawn at the end of this text (Enter)", _NOTE)])
    t = rec.trimmed
    if t is not None:
        rows.append(
            [
                (
                    f"context policy ({t.policy}): {t.dropped_messages} message(s) dropped, "
                    f"{t.prompt_tokens_before:,} → {t.prompt_tokens_after:,} tokens (n_ctx {t.n_ctx:,})",
                    _NOTE,
                )
            ]
        )
    elif not short:
        rows.append([("context policy: nothing dropped", LABEL)])
    if fallback:
        rows.append(
            [
                (
                    "an older trace: no per-token texts recorded, so the prompt is its text, "
                    "without token boundaries or ids",
                    _NOTE,
                )
            ]
        )
    elif n_prompt is None:
        rows.append([("the server did not send the prompt it built: only the reply's tokens are shown", _NOTE)])
    if not short:
        rows.append(
            [
                ("control", _style(CONTROL, 0)),
                (" ", LABEL),
                ("prompt", _style(PROMPT, 1)),
                (" ", LABEL),
                ("reply", _style(REPLY, 0)),
                (" · cursor: ←/→ ↑/↓ PgUp/PgDn Home/End", LABEL),
            ]
        )
    return [r for p in rows for r in figure_rows(p, width)]


def status_line(t: DocToken | None) -> Line:
    if t is None:
        return (("no token", LABEL),)
    what = {
        PROMPT: "prompt",
        CONTROL: "control token",
        PREFIX: "reply, chosen earlier",
        REPLY: "reply",
        STOP: "end of generation",
        TEXT: "the prompt's text",
    }[t.kind]
    if t.kind == TEXT:
        return (("the prompt as its text", _STATUS_KEY), (" · no token boundaries or ids in this trace", LABEL))
    tid = "not given" if t.token_id is None else str(t.token_id)
    raw = t.step.piece_bytes if t.step is not None else None
    piece = (
        byte_face(raw)
        if raw is not None and partial_character(raw)
        else repr(t.step.piece if t.step is not None else t.text)
    )
    out: list[tuple[str, Style]] = [
        (f"id {tid}", _STATUS_KEY),
        (f" · {piece} · ", _STATUS),
        (f"position {t.position}" if t.position is not None else "position ?", _STATUS),
        (f" · {what}", LABEL),
    ]
    if t.step is not None:
        out.append((f" step {t.step.index}", LABEL))
        if t.step.chosen_by == "hand":  # step mode: the user put it in
            out.append((" · picked by hand", _STATUS_KEY))
    return tuple(out)


__all__ = ["DocumentView", "DocumentLines", "shown_form", "header_lines", "status_line"]
