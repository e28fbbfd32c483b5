"""The chat's replies -> the conversation store (history/), without Textual.

`HistoryRecorder` turns what the session did into `StoreWriter` calls. Each call is a
queue put: the writes run on the writer's own thread, never on the UI's. The app calls

- `sent(rec, text)` when a message is sent, `regenerated(old, new)` for F5 and a branch,
  `switched(rec)` when another version of a reply is shown (`rec`: the last reply now);
- `sync(rec)` once per frame for the reply in flight (and each reply that ended in the
  frame): what arrived since the last frame goes to the store as one batch;
- `reset()` for a new conversation, `opened(...)` when a stored one is continued.

A new conversation is written at its first reply's Start (the model's name, file and
size come from it), with its user message and the reply's node; a prompt the engine
refused (no Start) leaves nothing. A reply enters the conversation's line (the parent of
the next message) as it enters the session's turns: finished with text and not failed.
Any other reply (stopped before its first token, failed, cut) stays in the tree as a
side branch, and so does a side-by-side replay in the other mode (F9, `replayed`): a
reopened conversation has every reply the chat numbered, under the same numbers. A
played trace is not stored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loopchat.chat.conversation import ReplyRecord
from loopchat.events import DOCUMENT, Event, Finish, FinishReason
from loopchat.trace import TracedEvent, cut_short_event

if TYPE_CHECKING:
    from loopchat.history.writer import StoreWriter

#: titles are the first message, on one line, at most this many characters
TITLE_CHARS = 60

#: Finish.error of a reply that a new conversation (or an opened one) left unfinished, or
#: the quit (shown after "stopped (cancelled): ")
LEFT_UNFINISHED = "the conversation was left while this reply was being generated"
QUIT_DURING = "the app quit while this reply was being generated"


def title_of(text: str) -> str:
    """A conversation's title: its first message on one line, shortened."""
    one = " ".join(text.split())
    return one if len(one) <= TITLE_CHARS else one[: TITLE_CHARS - 1].rstrip() + "…"


def made_up_finish(rec: ReplyRecord, reason: FinishReason, error: str) -> Finish:
    """A Finish for a reply that has none (failed, left, cut), every number computed
    from its events as `trace.read_trace` does for a cut trace."""
    run = [TracedEvent(0.0, e) for e in (rec.start, rec.prefill, *rec.steps) if e is not None]
    finish = cut_short_event(run)
    return dataclasses.replace(finish, reason=reason, error=error)


@dataclass
class _Stored:
    """What the store holds (or will: ids are the writer's refs) of one reply."""

    before: Any  # the node the user message hangs from (None: the conversation's first)
    user_text: str | None = None  # None: the user node exists already (`user`)
    role: str = "user"  # the user node's role: "user", or DOCUMENT (completion mode)
    user: Any = None  # the user message's node
    node: Any = None  # the reply's node (None until its Start)
    made_conversation: bool = False  # this reply's message started the stored conversation
    steps_sent: int = 0
    trimmed_sent: bool = False
    prefill_sent: bool = False
    finished: bool = False


class HistoryRecorder:
    def __init__(self, writer: StoreWriter, system_prompt: Callable[[], str | None] = lambda: None) -> None:
        self.writer = writer
        self._system_prompt = system_prompt
        self.conversation: Any = None  # the conversation's id or the writer's ref to it
        self.tip: Any = None  # the last node of the conversation's line: the next message's parent
        self._replies: dict[ReplyRecord, _Stored] = {}

    # ---- what the user did -------------------------------------------------------
    def sent(self, rec: ReplyRecord, text: str) -> None:
        """A message was sent; in completion mode the text appended to the document, kept
        as typed in a node of role "document" (the document is the line's nodes in order)."""
        if rec.is_document:
            self._replies[rec] = _Stored(before=self.tip, user_text=text, role=DOCUMENT)
        else:
            self._replies[rec] = _Stored(before=self.tip, user_text=text.strip())

    def regenerated(self, old: ReplyRecord, new: ReplyRecord) -> None:
        """F5, or a branch: the new reply is a sibling of the old (the same user message)."""
        o = self._replies.get(old)
        if o is None:
            return
        self.tip = o.before  # the session dropped the old turn (or never had it)
        self._replies[new] = _Stored(
            before=o.before, user_text=o.user_text if o.user is None else None, user=o.user, role=o.role
        )

    def replayed(self, orig: ReplyRecord, new: ReplyRecord) -> None:
        """F9: the replay is stored beside the reply it replays (a sibling that never
        becomes the line's tip: the conversation goes on from the reply)."""
        o = self._replies.get(orig)
        if o is not None:
            self._replies[new] = _Stored(
                before=o.before, user_text=o.user_text if o.user is None else None, user=o.user, role=o.role
            )

    def reset(self) -> None:
        """A new conversation: the next message starts one in the store."""
        self._leave()
        self.conversation = None
        self.tip = None
        self._replies = {}

    def opened(
        self, conversation_id: int, tip: int | None, replies: dict[ReplyRecord, tuple[int, int | None, int]]
    ) -> None:
        """A stored conversation was opened: new messages go on from `tip`; `replies`
        maps its rebuilt replies to (their user node, that node's parent, their node), for
        F5, branches and switching versions."""
        self.reset()
        self.conversation = conversation_id
        self.tip = tip
        for rec, (user, before, node) in replies.items():
            self._replies[rec] = _Stored(before=before, user=user, node=node, finished=True)

    def switched(self, rec: ReplyRecord) -> None:
        """Another version of a turn's reply is shown, and `rec` is now the conversation's
        last reply: the next message hangs from it (or, if it is not part of the
        conversation's turns, from its message's parent, as after a reply stopped before
        its first token)."""
        s = self._replies.get(rec)
        if s is None:
            return
        self.tip = s.node if rec.in_turns and s.node is not None else s.before

    def withdrawn(self, rec: ReplyRecord) -> None:
        """The session took `rec`'s turn back (its prompt refused, or the reply stopped
        before its first token: the message is back in the box): what was written of it
        goes, the conversation with it if that message started it."""
        s = self._replies.pop(rec, None)
        if s is None or s.node is None:  # nothing written yet: nothing will be
            return
        if s.made_conversation:
            self.writer.delete(self.conversation)
            self.conversation = self.tip = None
        elif s.user_text is not None and s.user is not None:  # its message node, its reply below it
            self.writer.delete_node(self.conversation, s.user)

    def forget(self, conversation_id: int) -> bool:
        """The conversation `conversation_id` was deleted: if it is the one recorded,
        the next message starts a new one. True if it was."""
        if self.conversation is None or self._id(self.conversation) != conversation_id:
            return False
        self._replies = {}  # nothing more is written to it
        self.conversation = None
        self.tip = None
        return True

    def current_id(self) -> int | None:
        """The recorded conversation's id (None: none yet, or not written)."""
        return None if self.conversation is None else self._id(self.conversation)

    @staticmethod
    def _id(ref: Any) -> int | None:
        if isinstance(ref, int):
            return ref
        try:
            return ref.result(timeout=2.0)
        except Exception:  # noqa: BLE001  (a write that failed: the writer said so once)
            return None

    # ---- once per frame ----------------------------------------------------------------
    def sync(self, rec: ReplyRecord | None) -> None:
        """Write what `rec` received since the last call (one batch), and its end."""
        if rec is None:
            return
        s = self._replies.get(rec)
        if s is None or s.finished:
            return
        if rec.start is None:
            if rec.done:  # the prompt was refused before the run started: nothing to keep
                del self._replies[rec]
            return
        w = self.writer
        if s.node is None:
            if self.conversation is None:
                start = rec.start
                first = (
                    s.user_text
                    if s.user_text is not None
                    else next((m.content for m in reversed(rec.messages) if m.role in ("user", DOCUMENT)), "")
                )
                self.conversation = w.new_conversation(
                    title=title_of(first or rec.prompt_document) or "(empty message)",
                    model_name=start.model_name,
                    model_path=start.model_path or "",
                    model_size=start.model_size_bytes or 0,
                    system_prompt=self._system_prompt(),
                )
                s.made_conversation = True
            if s.user is None:
                s.user = w.add_message(self.conversation, s.before, s.role, s.user_text or "")
            s.node = w.begin_reply(self.conversation, s.user, rec.mode, rec.start)
        batch: list[Event] = []
        if rec.trimmed is not None and not s.trimmed_sent:
            s.trimmed_sent = True
            batch.append(rec.trimmed)
        if rec.prefill is not None and not s.prefill_sent:
            s.prefill_sent = True
            batch.append(rec.prefill)
        n = len(rec.steps)
        if n > s.steps_sent:
            batch.extend(rec.steps[s.steps_sent : n])
            s.steps_sent = n
        if batch:
            w.add_events(s.node, batch)
        if rec.done:
            finish = rec.finish or made_up_finish(rec, FinishReason.ERROR, rec.error or "failed")
            w.finish_reply(s.node, finish)
            s.finished = True
            if rec.in_turns:
                self.tip = s.node

    def _leave(self, why: str = LEFT_UNFINISHED) -> None:
        """Replies left unfinished (the session no longer reads their events): end them
        in the store with what they had, as stopped."""
        for rec, s in self._replies.items():
            if s.node is not None and not s.finished:
                self.sync(rec)  # the steps not yet written
                if not s.finished:
                    self.writer.finish_reply(s.node, made_up_finish(rec, FinishReason.CANCELLED, why))
                    s.finished = True

    def close(self, timeout: float = 5.0, why: str | None = None) -> None:
        """End what is unfinished (as stopped), then let the writer finish its queue."""
        self._leave(why or QUIT_DURING)
        self.writer.close(timeout)
