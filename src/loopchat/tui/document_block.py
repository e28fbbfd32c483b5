"""Completion mode's transcript: the document as one block.

In completion mode the user writes a document and the model continues it (no chat
template). The transcript shows that one document: what the user wrote in the plain
text colour, each continuation in the reply colour, its tokens clickable (the panel shows
their passes) and coloured by F6/F7 as a reply's are. A `DocumentBlock` is a ReplyView
of the latest continuation whose text is the whole document: the earlier pieces first,
then that reply's tokens, streamed onto the open last line as a reply's are. Each new
continuation's block takes the place of the one before (Transcript.add_turn).
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

from loopchat.chat.conversation import BLOCKING, ReplyRecord
from loopchat.chat.plots import visible_controls
from loopchat.chat.prefs import Prefs
from loopchat.events import Step
from loopchat.tui.blocks import _REPLY, ReplyView, _clickable
from loopchat.tui.token_styles import PassParity

#: what the user wrote: the transcript's plain text colour
_WRITTEN = Style()


class DocumentBlock(ReplyView):
    #: the transcript keeps one of these and replaces it (no "You" block before it)
    whole_document = True

    def __init__(self, records: list[ReplyRecord], prefs: Prefs) -> None:
        """`records`: the continuations the document holds, in order, the latest last
        (Conversation.shown_document)."""
        super().__init__(records[-1], prefs)
        self.records = records
        self.selected_reply: int | None = None

    def shows(self, reply: int) -> bool:
        return any(r.number == reply for r in self.records)

    def select(self, step_index: int | None, reply: int | None = None) -> None:
        reply = None if step_index is None else (reply if reply is not None else self.record.number)
        if (reply, step_index) != (self.selected_reply, self.selected):
            self.selected_reply, self.selected = reply, step_index
            self.changed()

    def _title_head(self) -> str:
        return f"Document (completion mode) · reply {self.record.number}"

    def _markdown_ok(self) -> bool:
        return False  # a document is shown as written, token by token

    def _style_of(self, step: Step, n: int, selected: bool) -> Style | None:
        return _REPLY + super()._style_of(step, n, selected)  # the model's text: the reply colour

    def _live_text(self) -> Text:
        return self._styled_text()  # in blocking mode too: the document so far, its continuation at the end

    def body_text(self) -> str:
        return self._styled_text().plain

    def info_text(self) -> Text:
        base = super().info_text()
        out = Text("completion · ", style=base.style)
        out.append_text(base)
        return out

    def _styled_text(self) -> Text:
        text, n, self.passes = Text(), 0, PassParity()
        before = ""
        for r in self.records:
            doc = r.prompt_document
            text.append(visible_controls(doc[len(before) :] if doc.startswith(before) else doc), _WRITTEN)
            before = doc + r.text
            if r is self.record and r.mode == BLOCKING and not r.done:
                break  # its continuation appears whole when it is complete
            shown = 0
            for step in r.steps:
                if step.is_stop or not step.text:
                    continue
                selected = (r.number, step.index) == (self.selected_reply, self.selected)
                text.append(step.text, _clickable(self._style_of(step, n, selected), r.number, step.index))
                n += 1
                shown += 1
            if not shown and r.finish is not None and r.finish.text:
                text.append(r.finish.text, _REPLY)  # a trace without steps
        self._n_tokens = n
        return text
