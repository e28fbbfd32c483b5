"""The chat's N replies in one batch (Shift+F5, batch.py): the last reply written again N
times, the N replies landing as versions of it (Alt+PgUp / Alt+PgDn).

The run's events carry their sequence. Sequence 0's go to the reply shown (the session's
`current`, as for F5); the others' to N-1 versions set aside (hidden, out of the
conversation until shown), which `BatchIntake.route` fills as their events come. Sequence 0's
Finish is held until every sequence has ended, so the session sees one reply end, once, when
the whole batch has: nothing else can start while the batch still runs.
"""

from __future__ import annotations

from typing import Any

from loopchat.chat.conversation import Conversation, ReplyRecord
from loopchat.events import Finish, Prefill, RunDone, Start, Step, WorkerError


class BatchIntake:
    """The N-1 versions of a batch beside its shown reply (`main`, sequence 0)."""

    def __init__(self, conversation: Conversation, main: ReplyRecord, extras: list[ReplyRecord]) -> None:
        self.conversation = conversation
        self.main = main
        self.extras = extras
        self.held: Finish | None = None  # sequence 0's Finish, until the others have ended
        self.over = False

    def route(self, ev: Any, finished: list[ReplyRecord]) -> Any:
        """The event for the session's own handling (the shown reply's), or None when it was
        another sequence's (recorded here; a version that ends goes into `finished`)."""
        if isinstance(ev, Prefill):  # the batch's one prefill: every version's
            for rec in self.extras:
                rec.prefill = ev
            return ev
        if isinstance(ev, WorkerError):  # refused before it ran: the versions go with the reply
            self._drop()
            return ev
        if isinstance(ev, RunDone):
            self.over = True
            return ev
        seq = getattr(ev, "sequence", None)
        if seq is None:
            return ev
        if seq == 0:
            if isinstance(ev, Finish) and not self._extras_done():
                self.held = ev
                return None
            return ev
        rec = self.extras[seq - 1]
        if isinstance(ev, Start):
            rec.start = ev
        elif isinstance(ev, Step):
            rec.steps.append(ev)
        elif isinstance(ev, Finish):
            rec.finish = ev
            finished.append(rec)
            if self.held is not None and self._extras_done():
                held, self.held = self.held, None
                return held
        return None

    def _extras_done(self) -> bool:
        return all(r.finish is not None for r in self.extras)

    def _drop(self) -> None:
        for rec in self.extras:
            if rec in self.conversation.replies:
                self.conversation.replies.remove(rec)
            if rec in rec.siblings:
                rec.siblings.remove(rec)
        self.extras = []
        self.over = True


__all__ = ["BatchIntake"]
