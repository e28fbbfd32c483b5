"""The transcript's view of each reply: which block shows which reply record, the turns
set aside with a version of a reply that another version replaced, the selected token's
highlight. The app asks it; it asks the Transcript widget (transcript.py) to lay the
blocks out, and reads the session (chat/session.py) for the conversation and the prefs.

A turn's reply can have versions (F5, branches): the transcript shows one, its title
says which ("version 2/3"), and the conversation goes on from the one shown.
"""

from __future__ import annotations

from collections.abc import Callable

from loopchat.chat.conversation import ReplyRecord
from loopchat.chat.prefs import Prefs
from loopchat.chat.session import ChatSession
from loopchat.events import Step
from loopchat.tui.blocks import Block, ReplyView
from loopchat.tui.transcript import Transcript


class ReplyViews:
    def __init__(self, session: ChatSession, prefs: Prefs, transcript: Callable[[], Transcript]) -> None:
        self.session = session
        self.prefs = prefs
        self._transcript = transcript  # (the widget is made after the app)
        #: the block that shows each reply
        self.by_reply: dict[ReplyRecord, ReplyView] = {}
        #: the blocks shown after a version of a reply that another version replaced
        self.tails: dict[ReplyRecord, list[Block]] = {}

    @property
    def transcript(self) -> Transcript:
        return self._transcript()

    def get(self, rec: ReplyRecord | None) -> ReplyView | None:
        return self.by_reply.get(rec) if rec is not None else None

    # ---- turns ----------------------------------------------------------------------
    def add(self, rec: ReplyRecord, user_text: str | None) -> ReplyView:
        """A turn at the transcript's end: the message `user_text` (None: none, or the
        document) and the reply's view."""
        view = self.transcript.add_turn(user_text, rec, self.prefs, self.session.conversation)
        self.by_reply[rec] = view
        return view

    def show_new(self, rec: ReplyRecord, user_text: str | None = None) -> None:
        """A new reply in the transcript, which follows it (anchored)."""
        self.add(rec, user_text)
        self.transcript.anchor()

    def drop(self, rec: ReplyRecord, shown_again: ReplyRecord | None = None) -> None:
        """The turn of a reply withdrawn (its prompt refused, or stopped before its first token);
        a version refused (F5, a branch): `shown_again`, the one it was to replace, in its place."""
        if shown_again is not None:
            self.clear_selection()
            self.swap_version(rec, shown_again)
            self.by_reply.pop(rec, None), self.tails.pop(rec, None)
            return
        self.transcript.drop_turn(self.by_reply.pop(rec, None), self.prefs, self.session.conversation)

    def add_steps(self, due: list[tuple[ReplyRecord, list[Step]]]) -> None:
        """The streamed tokens not yet drawn, to their replies' views."""
        for rec, steps in due:
            view = self.by_reply.get(rec)
            if view is not None:
                view.add_steps(steps)

    def reset(self) -> None:
        """An empty transcript (a new conversation, or one opened from the store)."""
        self.by_reply.clear()
        self.tails.clear()
        self.transcript.clear()

    def show_restored(self, shown: list[tuple[str, ReplyRecord | None]]) -> None:
        """A stored conversation's turns: (user text, reply; None: a message alone)."""
        for user, rec in shown:
            if rec is None:
                self.transcript.add_user(user)
            else:  # (a document: the document so far, each continuation in the place of the one before)
                self.add(rec, user or None)
        self.transcript.anchor()

    def swap_version(self, old: ReplyRecord, new: ReplyRecord) -> None:
        """Show `new` in `old`'s place in the transcript; the turns shown after `old` go
        with it (and come back when it is shown again), those kept with `new` come back."""
        t = self.transcript
        conversation = self.session.conversation
        view = self.by_reply.get(old)
        fresh = t.view_for(new, self.prefs, conversation)
        if view is not None:
            self.tails[old] = t.take_after(view)
        if view is not None and t.replace_block(view, fresh):
            self.by_reply[new] = fresh
        else:  # (a document: its block, wherever the version's turn is in it)
            self.add(new, None)
        stashed = self.tails.pop(new, None)
        if stashed is not None:
            t.extend(stashed)
        else:  # never shown here (a stored conversation's other path): its turns, made now
            for rec in conversation.later(new):
                self.add(rec, None if rec.replay_of is not None else rec.messages[-1].content)
        for rec in new.siblings:  # their titles say how many versions there are now
            other = self.by_reply.get(rec)
            if other is not None and other is not self.by_reply[new]:
                other.changed()
        t.anchor()

    # ---- the token selection --------------------------------------------------------
    def select(self, reply: int, step: int) -> None:
        """Highlight step `step` of reply number `reply` (and scroll to it); no other."""
        for view in self.transcript.reply_views():
            if view.shows(reply):
                view.select(step, reply)
                self.transcript.scroll_to_block(view)
            elif view.selected is not None:
                view.select(None)

    def clear_selection(self) -> None:
        for view in self.transcript.reply_views():
            if view.selected is not None:
                view.select(None)

    def rebuild_all(self) -> None:
        """Every reply drawn again (a display pref changed)."""
        for view in self.transcript.reply_views():
            view.rebuild()
