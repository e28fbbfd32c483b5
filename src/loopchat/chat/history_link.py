"""The chat's side of the conversation store: the recorder's writer started and stopped,
its failures told once, a frame's events recorded, a stored conversation loaded to
continue it, the History toggle. No Textual: what to tell the user goes to `notify`
(the app's own, which takes Textual's notify arguments).

The writer reports a failure on its own thread: the line waits in a deque that the
app's frame reads (`poll`): no call into the app from another thread, none that could
wait on a UI thread busy closing that writer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loopchat.chat.history_recorder import HistoryRecorder
from loopchat.chat.session import ChatSession, Update
from loopchat.chat.stored_replies import Restored

#: why Ctrl+O has nothing to show, when history was never on in this run
OFF_NOTE = "History is off (--no-history, or Ctrl+P → History): nothing is stored"


class HistoryLink:
    def __init__(self, path: Path | None, session: Callable[[], ChatSession], notify: Callable[..., Any]) -> None:
        """`path`: the conversation store (None: history off for this run); `session`:
        the app's session (read when a reply is recorded)."""
        self.path = path
        self._session = session
        self.notify = notify
        #: the recorder, while the History pref is on and the store works
        self.recorder: HistoryRecorder | None = None
        self.error: str | None = None  # why history went off (the store's one line)
        self._failures: deque[str] = deque()  # the writer's failures, for the frame

    def start(self, enabled: bool) -> None:
        """Record this run's conversations (a store path, and `enabled`: the pref on)."""
        if self.path is None or not enabled or self.recorder is not None:
            return
        from loopchat.history.store import StoreError
        from loopchat.history.writer import StoreWriter

        def tightened(line: str) -> None:  # a history file others could read is now 0600 (notify: thread-safe)
            self.notify(line, title="History", timeout=10, markup=False)

        try:
            writer = StoreWriter(self.path, on_error=self._failures.append, on_notice=tightened)
        except StoreError as exc:
            self.failed(str(exc))
            return
        self.recorder = HistoryRecorder(writer, lambda: self._session().conversation.system_prompt)

    def stop(self, why: str | None = None) -> None:
        h, self.recorder = self.recorder, None
        if h is not None:
            h.close(why=why)

    def failed(self, line: str) -> None:
        """The store cannot be opened or written: say so once; the chat goes on without it."""
        if self.error is None:
            self.notify(line, title="History off", severity="error", timeout=15)
        self.error = line
        self.stop()

    def poll(self) -> None:
        """Once a frame: a failure the writer reported since (one a frame)."""
        if self._failures:
            self.failed(self._failures.popleft())

    def record(self, u: Update) -> None:
        """The frame's events, to the store (queue puts only)."""
        h = self.recorder
        if h is None:
            return
        if u.dropped is not None:  # its message went back to the box: nothing of it is kept
            h.withdrawn(u.dropped)
        if u.shown_again is not None:  # a version refused: the one shown again is the line's tip
            h.switched(u.shown_again)
        current = self._session().current
        h.sync(current)
        for rec in u.finished:
            if rec is not current:
                h.sync(rec)

    def off_note(self) -> str:
        """Why there is no list to show (history off)."""
        return f"History is off: {self.error}" if self.error else OFF_NOTE

    def load(self, conversation_id: int) -> tuple[Restored, str] | None:
        """A stored conversation, made into replies, and its title (None: said why)."""
        from loopchat.chat.stored_replies import restore
        from loopchat.history.store import ConversationStore, StoreError

        if self.recorder is not None:
            self.recorder.writer.flush(2.0)  # what this run wrote is in the file
        try:
            store = ConversationStore.open_reader(self.path)
            try:
                stored = store.load(conversation_id)
            finally:
                store.close()
        except KeyError:
            self.notify("That conversation is no longer stored", severity="warning")
            return None
        except StoreError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return None
        return restore(stored), stored.summary.title

    def toggle(self, on: bool) -> None:
        """The History pref was turned on or off."""
        if not on:
            self.stop()
            self.notify("History off: nothing more is stored (the stored conversations stay)", timeout=4)
            return
        if self.path is None:
            self.notify(
                "History stays off in this run (--no-history, or a replay): it is on from the next start", timeout=5
            )
            return
        self.error = None
        self.start(True)
        self.notify("History on: conversations are stored from the next message", timeout=4)
