"""The app's side of the conversation store (a mixin of LoopChatApp): the recorder's
writer started and stopped, its failures told once, the list (Ctrl+O), opening a stored
conversation to continue it, the History toggle.

The writer reports a failure on its own thread: the line waits in a deque that the
frame timer reads (no call into the app from another thread, none that could wait on a
UI thread busy closing that writer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loopchat.chat.history_recorder import HistoryRecorder

if TYPE_CHECKING:
    from loopchat.tui.app import LoopChatApp

    _Base = LoopChatApp
else:
    _Base = object

#: why Ctrl+O has nothing to show, when history was never on in this run
OFF_NOTE = "History is off (--no-history, or Ctrl+P → History): nothing is stored"


class HistoryActions(_Base):
    def _start_history(self) -> None:
        """Record this run's conversations (history_path set and the pref on)."""
        if self.history_path is None or not self.prefs.history or self.history is not None:
            return
        from loopchat.history.store import StoreError
        from loopchat.history.writer import StoreWriter

        def tightened(line: str) -> None:  # a history file others could read is now 0600 (notify: thread-safe)
            self.notify(line, title="History", timeout=10, markup=False)

        try:
            writer = StoreWriter(self.history_path, on_error=self._history_notices.append, on_notice=tightened)
        except StoreError as exc:
            self._history_failed(str(exc))
            return
        self.history = HistoryRecorder(writer, lambda: self.session.conversation.system_prompt)

    def _stop_history(self, why: str | None = None) -> None:
        h, self.history = self.history, None
        if h is not None:
            h.close(why=why)

    def _history_failed(self, line: str) -> None:
        """The store cannot be opened or written: say so once; the chat goes on without it."""
        if self.history_error is None:
            self.notify(line, title="History off", severity="error", timeout=15)
        self.history_error = line
        self._stop_history()

    def _record(self, u) -> None:  # noqa: ANN001  (session.Update)
        """The frame's events, to the store (queue puts only)."""
        h = self.history
        if h is None:
            return
        if u.dropped is not None:  # its message went back to the box: nothing of it is kept
            h.withdrawn(u.dropped)
        current = self.session.current
        h.sync(current)
        for rec in u.finished:
            if rec is not current:
                h.sync(rec)

    # ---- the list ------------------------------------------------------------------
    def action_history(self) -> None:
        from loopchat.tui.history_screen import HistoryScreen

        if isinstance(self.screen, HistoryScreen):
            self.screen.dismiss(None)
            return
        if self.history is None:
            self.notify(f"History is off: {self.history_error}" if self.history_error else OFF_NOTE, severity="warning")
            return
        h = self.history

        def delete(conversation_id: int) -> None:
            h.writer.delete(conversation_id)
            if h.forget(conversation_id):
                self.notify("The conversation on screen was deleted: the next message starts a new one", timeout=4)

        self.push_screen(
            HistoryScreen(self.history_path, rename=h.writer.rename, delete=delete, current=h.current_id()),
            lambda chosen: chosen is not None and self.open_stored(chosen),
        )

    def open_stored(self, conversation_id: int) -> bool:
        """Show the stored conversation and continue it (the current one is replaced)."""
        from loopchat.chat.session import Refused
        from loopchat.chat.stored_replies import restore
        from loopchat.history.store import ConversationStore, StoreError

        if self.generating:
            self.notify("Stop the reply first (Esc), then open a conversation", severity="warning")
            return False
        if self.history is not None:
            self.history.writer.flush(2.0)  # what this run wrote is in the file
        try:
            store = ConversationStore.open_reader(self.history_path)
            try:
                stored = store.load(conversation_id)
            finally:
                store.close()
        except KeyError:
            self.notify("That conversation is no longer stored", severity="warning")
            return False
        except StoreError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return False
        restored = restore(stored)
        try:
            self.session.open_conversation(restored.conversation)
        except Refused as exc:
            self.notify(str(exc), severity="warning")
            return False
        self.selection = None
        self.views.clear()
        self._tails.clear()
        self.wire.forget()
        self.transcript.clear()
        for user, rec in restored.shown:
            if rec is None:
                self.transcript.add_user(user)
            else:  # (a document: the document so far, each continuation in the place of the one before)
                self.views[rec] = self.transcript.add_turn(user or None, rec, self.prefs, self.conversation)
        self.transcript.anchor()
        self._update_subtitle()  # (the conversation's mode: chat, or completion for a document)
        if self.history is not None:
            self.history.opened(conversation_id, restored.tip, restored.replies)
        self.run_finished.set()
        self._refresh_panel()
        n = len(restored.conversation.replies)
        self.notify(
            f"“{stored.summary.title}”: {n} repl{'y' if n == 1 else 'ies'} · the next message continues it", timeout=4
        )
        return True

    def action_toggle_history(self) -> None:
        self.prefs.history = not self.prefs.history
        self._save_prefs()
        if not self.prefs.history:
            self._stop_history()
            self.notify("History off: nothing more is stored (the stored conversations stay)", timeout=4)
            return
        if self.history_path is None:
            self.notify(
                "History stays off in this run (--no-history, or a replay): it is on from the next start", timeout=5
            )
            return
        self.history_error = None
        self._start_history()
        self.notify("History on: conversations are stored from the next message", timeout=4)
