"""The chat's branch keys (a mixin of LoopChatApp): Ctrl+R branches the reply at the
selected token, Alt+PgUp / Alt+PgDn show the previous / next version of the last reply.

A turn's reply can have versions (F5, branches): the transcript shows one, its title
says which ("version 2/3"), and the conversation goes on from the one shown. The
session (session.py) keeps the tree; this module only asks it and swaps the view.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from textual.app import SystemCommand

from loopchat.chat.conversation import ReplyRecord
from loopchat.chat.session import Refused
from loopchat.tui.branch_picker import BranchChoice, BranchPicker

if TYPE_CHECKING:
    from loopchat.tui.app import LoopChatApp

    _Base = LoopChatApp
else:
    _Base = object


class BranchActions(_Base):
    def branch_commands(self) -> Iterable[SystemCommand]:
        yield SystemCommand(
            "Branch here",
            "A new version of the reply from the selected token: another candidate, or a new draw (Ctrl+R)",
            self.action_branch,
        )
        yield SystemCommand(
            "Previous version of the reply", "Of the last reply's versions (Alt+PgUp)", lambda: self.action_version(-1)
        )
        yield SystemCommand(
            "Next version of the reply", "Of the last reply's versions (Alt+PgDn)", lambda: self.action_version(1)
        )

    def action_branch(self) -> None:
        """Open the branch picker for the selected token (the token cursor)."""
        if not self.backend.can_branch:
            self.notify(self.backend.branch_refusal, severity="warning")
            return
        if self.selection is None:
            self.notify("Select a token of a reply first (Alt+←/→ or a click), then Ctrl+R", severity="warning")
            return
        reply, index = self.selection
        rec = self.conversation.reply(reply)
        step = next((s for s in rec.steps if s.index == index), None) if rec is not None else None
        if rec is None or step is None:
            self.notify("That token's step is not recorded: nothing to branch from", severity="warning")
            return
        try:  # refuse at once what the session would refuse after the choice
            self.session.check_can_run()
        except Refused as exc:
            self.notify(str(exc), severity="warning")
            return
        self.push_screen(
            BranchPicker(reply, step, self.session.settings, self.backend.vocabulary()),
            lambda c: self._branch(reply, index, c),
        )

    def _branch(self, reply: int, index: int, choice: BranchChoice | None) -> None:
        if choice is None:
            return
        try:
            old, new = self.session.branch(reply, index, choice.token_id, self._mode())
        except Refused as exc:
            self.notify(str(exc), severity="warning")
            return
        if self.history is not None:
            self.history.regenerated(old, new)
        what = f"“{choice.label}”" if choice.token_id is not None else "a new draw"
        self.notify(f"Branch: reply {old.number} from token {index + 1}, with {what}", timeout=3)
        self._swap_version(old, new)
        self.run_finished.clear()

    def action_version(self, direction: int) -> None:
        """The versions of the selected token's reply (else of the last reply)."""
        reply = self.selection[0] if self.selection is not None else None
        try:
            old, new = self.session.switch_version(direction, reply)
        except Refused as exc:
            self.notify(str(exc), severity="warning")
            return
        self._swap_version(old, new)
        if self.history is not None:
            last = self.conversation.last_in_history()
            if last is not None:
                self.history.switched(last)  # the next message hangs from the path shown
        k, n = new.version
        self.notify(f"Version {k}/{n} of the reply", timeout=1.5)

    def _swap_version(self, old: ReplyRecord, new: ReplyRecord) -> None:
        """Show `new` in `old`'s place in the transcript; the turns shown after `old` go
        with it (and come back when it is shown again), those kept with `new` come back."""
        self.selection = None
        self._clear_selection_views()
        view = self.views.get(old)
        fresh = self.transcript.view_for(new, self.prefs, self.conversation)
        if view is not None:
            self._tails[old] = self.transcript.take_after(view)
        if view is not None and self.transcript.replace_block(view, fresh):
            self.views[new] = fresh
        else:  # (a document: its block, wherever the version's turn is in it)
            self.views[new] = self.transcript.add_turn(None, new, self.prefs, self.conversation)
        stashed = self._tails.pop(new, None)
        if stashed is not None:
            self.transcript.extend(stashed)
        else:  # never shown here (a stored conversation's other path): its turns, made now
            for rec in self.conversation.later(new):
                user = None if rec.replay_of is not None else rec.messages[-1].content
                self.views[rec] = self.transcript.add_turn(user, rec, self.prefs, self.conversation)
        for rec in new.siblings:  # their titles say how many versions there are now
            other = self.views.get(rec)
            if other is not None and other is not self.views[new]:
                other.changed()
        self.transcript.anchor()
        self._panel_dirty = True
        self._refresh_panel()
