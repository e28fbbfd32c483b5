"""The document view's model (the widget is tui/document_view.py): the exact text the
model reads for one reply, token by token, as rows at one width.

The model does not see messages: it continues one text, the chat template's rendering
with its control tokens. The document is drawn from the reply's Start event
(`prompt_token_texts`: what each prompt token adds; joined, the exact text, BOS
included), sets the template's control tokens apart (`prompt_special`), marks where the
reply begins and follows it with the reply's own tokens (its steps' texts). Token
boundaries are alternating backgrounds; a cursor walks the tokens and the status line
names the one under it: `id · 'piece' · position`. The header (document_header.py) says
how many tokens the prompt has, how many the prefill took from the KV cache and how many
it evaluated, and what the context policy dropped.

A trace from before `prompt_token_texts` was recorded: the prompt is shown as its text
(`Start.prompt_text`) with no boundaries.

Cheap: a reply's rows are made once for a width (`DocumentLines`) and a live reply only
appends its new steps' tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.style import Style

from loopchat.chat.conversation import ReplyRecord
from loopchat.chat.pass_stats import role
from loopchat.chat.plots import visible_controls
from loopchat.chat.views.document_surprisal import scored_prompt, status_pieces, surprisal_style
from loopchat.chat.views.lines import Line
from loopchat.events import Candidate, Prefill, Start, Step
from loopchat.token_faces import byte_face, partial_character

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
NOTE = Style.parse("italic #ffd75f")
STATUS = Style.parse("#d0d0d0")
STATUS_KEY = Style.parse("bold #ffaf00")

#: how a character that would not show is drawn (the others are drawn as they are)
VISIBLE = {"\n": "↵", "\t": "→", "\r": "␍"}
REPLY_MARK = "──▶ the reply begins here"


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
    #: a scored prompt (document_surprisal.py): its surprisal in bits (None: the first
    #: token), the model's top guess at its position, and its role (system, user, template)
    bits: float | None = None
    guess: Candidate | None = None
    role: str = ""


def token_style(kind: str, index: int) -> Style:
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
        style = token_style(token.kind, index)
        if token.role:  # a scored prompt: coloured by surprisal and role
            style = surprisal_style(_FG[token.kind], token.role, token.bits, index, token.kind == CONTROL)
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

    def column_of(self, index: int) -> int:
        """The cell at which token `index` starts on its first row."""
        x = 0
        for s, _, i in self.rows[self.tokens[index].first_row]:
            if i == index:
                return x
            x += cell_len(s)
        return 0

    def token_toward(self, cursor: int | None, row: int, step: int) -> int | None:
        """Where the cursor goes from token `cursor` to `row`: the token at its column on
        that row, else the next row's in the direction `step` (+1 down, -1 up); past the
        document's edge: its last / first token. None: no tokens, or nowhere to go."""
        if not self.tokens:
            return None
        col = self.column_of(cursor) if cursor is not None else 0
        row = max(0, min(row, self.height - 1))
        while 0 <= row < self.height:
            i = self.token_at(row, col)
            if i is not None and i != cursor:
                return i
            row += step
        return len(self.tokens) - 1 if step > 0 else 0


def prompt_tokens(start: Start, prefill: Prefill | None = None) -> list[DocToken]:
    ids = start.prompt_token_ids or ()
    texts = start.prompt_token_texts
    if texts and len(texts) == len(ids):
        special = set(start.prompt_special)
        out = [DocToken(t, i, CONTROL if p in special else PROMPT, p) for p, (i, t) in enumerate(zip(ids, texts))]
        for t, (bits, guess, role) in zip(out, scored_prompt(start, prefill) or ()):
            t.bits, t.guess, t.role = bits, guess, role
        return out
    if start.prompt_text is not None:
        return [DocToken(start.prompt_text, None, TEXT, None)]
    return []


def step_token(start: Start | None, st: Step) -> DocToken:
    n_prompt = len(start.prompt_token_ids or ()) if start is not None else 0
    if st.is_stop:
        return DocToken(st.piece, st.token_id, STOP, n_prompt + st.index, st)
    return DocToken(st.text, st.token_id, REPLY, n_prompt + st.index, st)


@dataclass(slots=True)
class DocumentLayout:
    """A reply's document at one width: its rows, where the reply starts (the index of its
    first token: its marker row is above it), whether the prompt is only its text (an
    older trace) and how many of the reply's steps the rows hold."""

    doc: DocumentLines
    reply_start: int = 0
    fallback: bool = False
    steps: int = 0

    def add_steps(self, rec: ReplyRecord) -> None:
        """The record's steps not laid out yet (a live reply's new tokens), appended."""
        for st in rec.steps[self.steps :]:
            self.doc.add(step_token(rec.start, st))
        self.steps = len(rec.steps)

    def step_at(self, index: int) -> int | None:
        """The token of the reply's step `index` (None: not in the document)."""
        tokens = self.doc.tokens
        for i in range(self.reply_start, len(tokens)):
            st = tokens[i].step
            if st is not None and st.index == index:
                return i
        return None


def lay_out(rec: ReplyRecord | None, width: int) -> DocumentLayout:
    """The document of `rec` (None: no reply yet) at `width`: the prompt's tokens, the
    reply's marker row, a branch's prefix (as the ids fed, when its steps are not in the
    record) and the reply's tokens."""
    layout = DocumentLayout(DocumentLines(width))
    if rec is None or rec.start is None:
        return layout
    doc, start = layout.doc, rec.start
    for t in prompt_tokens(start, rec.prefill):
        doc.add(t)
    layout.fallback = bool(doc.tokens) and doc.tokens[0].kind == TEXT
    branch = f" (a branch: {len(start.reply_prefix)} tokens chosen earlier first)" if start.reply_prefix else ""
    doc.mark(REPLY_MARK + branch)
    layout.reply_start = len(doc.tokens)
    n_prompt = len(start.prompt_token_ids or ())
    # a branch in the chat holds the steps of its prefix (the reply it continues):
    # they are shown as steps; a trace without them, as the ids fed
    if not any(st.index < len(start.reply_prefix) for st in rec.steps):
        for k, tid in enumerate(start.reply_prefix):
            doc.add(DocToken(f"⟨{tid}⟩", tid, PREFIX, n_prompt + k))
    layout.add_steps(rec)
    return layout


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
        return (("the prompt as its text", STATUS_KEY), (" · no token boundaries or ids in this trace", LABEL))
    tid = "not given" if t.token_id is None else str(t.token_id)
    raw = t.step.piece_bytes if t.step is not None else None
    piece = (
        byte_face(raw)
        if raw is not None and partial_character(raw)
        else repr(t.step.piece if t.step is not None else t.text)
    )
    out: list[tuple[str, Style]] = [
        (f"id {tid}", STATUS_KEY),
        (f" · {piece} · ", STATUS),
        (f"position {t.position}" if t.position is not None else "position ?", STATUS),
        (f" · {what}", LABEL),
    ]
    if t.role:
        out += status_pieces(t.bits, t.guess, t.role)
    if t.step is not None:
        out.append((f" step {t.step.index}", LABEL))
        if t.step.chosen_by == "hand":  # step mode: the user put it in
            out.append((" · picked by hand", STATUS_KEY))
        if t.step.pass_report is not None:  # under a draft: the pass that gave it (pass_stats.py)
            out.append((f" · pass {t.step.pass_report.number + 1}: {role(t.step)}", LABEL))
    return tuple(out)
