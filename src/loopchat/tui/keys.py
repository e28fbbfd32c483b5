"""The app's keys: the bindings and what each one does (a mixin of LoopChatApp).

Every key here is listed in help_screen.KEYS and docs/keys.md, and pressed by a test.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from textual.app import SystemCommand
from textual.binding import Binding

from loopchat.chat.conversation import BLOCKING, STREAM
from loopchat.chat.session import Refused
from loopchat.settings import KNOBS, SETTING, SamplingSettings
from loopchat.tui.prompt import PromptArea

if TYPE_CHECKING:
    from loopchat.tui.app import LoopChatApp

    _Base = LoopChatApp
else:
    _Base = object

#: the footer shows the raise / lower keys as one item
_KNOB_KEYS = Binding.Group("Adjust", compact=True)

BINDINGS = [
    # priority: the footer lists these first, and no focused widget takes them
    Binding("f1", "help", "Keys", priority=True),
    Binding("ctrl+q", "quit", "Quit", priority=True),
    Binding("escape", "stop", "Stop"),
    Binding("ctrl+up,alt+up", "knob(1)", "Raise", key_display="^↑", group=_KNOB_KEYS),
    Binding("ctrl+down,alt+down", "knob(-1)", "Lower", key_display="^↓", group=_KNOB_KEYS),
    Binding("f8", "next_knob", "Knob", show=False),
    Binding("f2", "settings", "Settings"),
    Binding("f3", "toggle_streaming", "Mode"),
    Binding("f5", "regenerate", "Regenerate"),
    Binding("f9", "replay_other_mode", "Other mode", show=False),
    Binding("f10", "toggle_wire", "Wire", show=False),
    # the document view (document_view.py); Ctrl+T: free in the message box (a TextArea)
    # and in terminals (F11 is often their full screen, Ctrl+E the box's line end)
    Binding("ctrl+t", "toggle_document", "Document", priority=True),
    # step mode (step_mode.py); priority: the message box and the search box do not take it
    Binding("f12", "step_mode", "Step mode", priority=True),
    Binding("ctrl+n", "new_conversation", "New"),
    # completion mode (Ctrl+L: free in the message box, whose Ctrl+E is the line's end)
    Binding("ctrl+l", "toggle_completion", "Completion mode", show=False),
    Binding("ctrl+o", "history", "Conversations", show=False),
    Binding("f4", "toggle_markdown", "Markdown", show=False),
    # priority: the message box (a TextArea) binds F6/F7 to select line / select all
    Binding("f6", "toggle_boundaries", "Token boundaries", show=False, priority=True),
    Binding("f7", "toggle_colours", "Probability colours", show=False, priority=True),
    Binding("ctrl+r", "branch", "Branch", show=False),  # (not Ctrl+B: tmux's prefix)
    Binding("alt+pageup", "version(-1)", "Previous version", show=False, priority=True),
    Binding("alt+pagedown", "version(1)", "Next version", show=False, priority=True),
    Binding("alt+left", "token_cursor(-1)", "Previous token", show=False),
    Binding("alt+right", "token_cursor(1)", "Next token", show=False),
    # compare two replies (compare_view.py); Ctrl+G: the message box (a TextArea) binds
    # Ctrl+K, tmux takes Ctrl+B. priority: it closes the compare screen too
    Binding("ctrl+g", "compare", "Compare", show=False, priority=True),
    Binding("ctrl+y", "copy_reply", "Copy reply", show=False, priority=True),  # not TextArea's redo
    # Ctrl+C stops a reply being generated (as in a terminal); otherwise Textual's own
    # hint ("press ctrl+q to quit"). priority: the message box would take it as copy.
    Binding("ctrl+c", "interrupt", "Stop", show=False, priority=True),
]


class KeyActions(_Base):
    def key_commands(self) -> Iterable[SystemCommand]:
        """The command palette's entries for the keys below."""
        yield SystemCommand("Stream/blocking mode", "Toggle how replies are shown (F3)", self.action_toggle_streaming)
        yield SystemCommand("Markdown", "Render finished replies as Markdown (F4)", self.action_toggle_markdown)
        yield SystemCommand("Token boundaries", "Show where each token starts (F6)", self.action_toggle_boundaries)
        yield SystemCommand(
            "Probability colours", "Colour tokens by their probability (F7)", self.action_toggle_colours
        )
        yield SystemCommand(
            "Document view",
            "The exact text the model reads, token by token ⇄ the chat (Ctrl+T)",
            self.action_toggle_document,
        )
        yield SystemCommand(
            "Wire view", "The side panel: the loop ⇄ the SSE lines on the wire (F10)", self.action_toggle_wire
        )
        yield SystemCommand(
            "Wire view: fold long values",
            "Fold / unfold the loopchat extension and top_logprobs (or click the view)",
            self.action_toggle_wire_fold,
        )
        yield SystemCommand(
            "Step mode",
            "Stop the reply before its next draw, or arm the next reply; again: run freely (F12)",
            self.action_step_mode,
        )
        yield SystemCommand(
            "Compare two replies",
            "Side by side: passes, times, tokens, entropy (Ctrl+G)",
            self.action_compare,
        )
        yield SystemCommand(
            "Replay last reply in the other mode", "Same seed and settings (F9)", self.action_replay_other_mode
        )
        yield SystemCommand("Regenerate last reply", "With a new seed (F5)", self.action_regenerate)
        yield SystemCommand("Copy last reply", "To the clipboard (Ctrl+Y)", self.action_copy_reply)
        yield SystemCommand("New conversation", "Start another conversation (Ctrl+N)", self.action_new_conversation)
        yield SystemCommand(
            "Completion mode" + (" → chat mode" if self.session.completion else ""),
            "Chat ⇄ a document the model continues, no chat template (Ctrl+L)",
            self.action_toggle_completion,
        )
        yield SystemCommand(
            "Completion mode: space before typed text: " + ("on → off" if self.prefs.completion_space else "off → on"),
            "A space before typed text that starts with a letter or digit when the document ends in a non-space",
            self.action_toggle_completion_space,
        )
        yield SystemCommand(
            "Conversations…", "The stored conversations: search, open, rename, delete (Ctrl+O)", self.action_history
        )
        yield SystemCommand(
            "History: " + ("on → off" if self.prefs.history else "off → on"),
            "Keep the conversations, with every step, in the history file",
            self.action_toggle_history,
        )
        yield SystemCommand("Sampling settings…", "Type values (F2)", self.action_settings)

    # ---- the reply --------------------------------------------------------------
    def action_stop(self) -> None:
        if self.session.cancel():
            self.notify("Stopping…", timeout=1.5)
        elif self.selection is not None:
            self.selection = None
            self._clear_selection_views()
            self._refresh_panel()
        elif self.screen is not self.screen_stack[0]:
            self.pop_screen()
        elif self.document.display:  # nothing else to stop: back to the chat
            self.action_toggle_document()

    def action_interrupt(self) -> None:
        focused = self.focused
        if self.generating:
            self.action_stop()
        elif isinstance(focused, PromptArea) and focused.selected_text:
            focused.action_copy()
        else:
            self.action_help_quit()

    def _mode(self) -> str:
        return STREAM if self.prefs.streaming else BLOCKING

    def action_regenerate(self) -> None:
        pinned = self.session.settings.seed
        try:
            old, new = self.session.regenerate(self._mode())
        except Refused as exc:
            self.notify(str(exc), severity="warning")
            return
        if self.history is not None:
            self.history.regenerated(old, new)
        if pinned is None:
            self.notify("Regenerating with a new random seed", timeout=2)
        else:
            self.notify(f"Regenerating with seed {self.session.settings.seed} (the next after {pinned})", timeout=3)
        self._swap_version(old, new)  # in its place: version n/n of the turn's reply
        self.run_finished.clear()

    def action_replay_other_mode(self) -> None:
        try:
            rec = self.session.replay_other_mode()
        except Refused as exc:
            self.notify(str(exc), severity="warning")
            return
        if self.history is not None:  # stored, so that a reopened conversation keeps the numbers
            self.history.replayed(self.conversation.reply(rec.replay_of), rec)
        self._show_new_reply(rec)
        original = self.conversation.reply(rec.replay_of or 0)
        start = original.start if original is not None else None
        if start is not None and start.source:  # a server may ignore the seed: say so, compare after
            self.notify(
                f"Replaying reply {original.number} with its seed {start.settings.seed} on {start.source}: a server "  # type: ignore[union-attr]
                "may not reproduce it; its tokens are compared with the original's when it ends",
                timeout=6,
            )

    def action_compare(self) -> None:
        """Two finished replies side by side: the selected token's reply (or the last)
        and the one before it; Ctrl+G again closes."""
        from loopchat.chat.reply_stats import comparable
        from loopchat.tui.compare_view import CompareScreen, default_pair

        if isinstance(self.screen, CompareScreen):
            self.screen.dismiss(None)
            return
        if self.screen is not self.screen_stack[0]:
            return  # another dialog is open
        replies = comparable(self.conversation.replies)
        if len(replies) < 2:
            self.notify("Compare needs two finished replies: send another message first", severity="warning")
            return
        a, b = default_pair(replies, self.selection[0] if self.selection else None)
        self.push_screen(CompareScreen(replies, a, b))

    def action_new_conversation(self) -> None:
        if self.history is not None:
            self.history.reset()
        self.session.new_conversation()
        self._show_new_conversation()
        self.notify("New document" if self.session.completion else "New conversation", timeout=1.5)

    def _show_new_conversation(self) -> None:
        """The session started a new conversation: an empty transcript, nothing selected."""
        self.selection = None
        self.views.clear()
        self._tails.clear()
        self.wire.forget()
        self.transcript.clear()
        self.run_finished.set()
        self._refresh_panel()

    def action_toggle_completion(self) -> None:
        """Chat mode ⇄ completion mode (a conversation under way is left for a new one)."""
        left = bool(self.conversation.replies)
        try:
            message = self.session.toggle_mode()
        except Refused as exc:
            self.notify(str(exc), severity="warning")
            return
        if left:
            if self.history is not None:
                self.history.reset()
            self._show_new_conversation()
        self._update_subtitle()
        if self.session.model_ready:
            self.prompt.placeholder = self._placeholder()
        self.notify(message, timeout=4)

    def action_copy_reply(self) -> None:
        rec = self.session.last_done_reply()
        if rec is None:
            self.notify("No reply to copy yet", severity="warning")
            return
        self.copy_to_clipboard(rec.text)
        self.notify(f"Copied reply {rec.number} ({len(rec.text)} characters)", timeout=2)

    # ---- sampling settings --------------------------------------------------------
    def action_next_knob(self) -> None:
        self.knob = KNOBS[(KNOBS.index(self.knob) + 1) % len(KNOBS)]
        self.notify(f"Ctrl+↑/↓ now change {self.knob}", timeout=2)
        self._refresh_panel()

    def action_knob(self, direction: int) -> None:
        value = SETTING[self.knob].nudge(getattr(self.session.in_force(), self.knob), direction)
        if self.set_setting(**{self.knob: value}) and (note := self.session.settings_note()):
            self.notify(note, timeout=4)
        self.change_made_after_steps = self.steps_emitted()
        self._refresh_panel()

    def action_settings(self) -> None:
        from loopchat.tui.settings_dialog import SettingsDialog

        def done(new: SamplingSettings | None) -> None:
            if new is not None:
                changes = {n: getattr(new, n) for n in new.diff(self.session.settings)}
                if self.set_setting(**changes) and changes and (note := self.session.settings_note()):
                    self.notify(note, timeout=4)
                self._refresh_panel()

        self.push_screen(
            SettingsDialog(
                self.session.settings,
                generating=self.generating,
                live=self.backend.live_settings,
                stopped=self.session.stopped,
            ),
            done,
        )

    # ---- preferences ----------------------------------------------------------------
    def action_toggle_streaming(self) -> None:
        self.prefs.streaming = not self.prefs.streaming
        self._save_prefs()
        self._update_subtitle()
        mode = (
            "streaming: tokens appear as they are drawn"
            if self.prefs.streaming
            else "blocking: the reply appears when complete"
        )
        self.notify(f"Next replies: {mode}", timeout=3)

    def _rebuild_all(self) -> None:
        for view in self.transcript.reply_views():
            view.rebuild()

    def action_toggle_markdown(self) -> None:
        self.prefs.markdown = not self.prefs.markdown
        self._save_prefs()
        self._rebuild_all()
        self.notify("Finished replies: " + ("Markdown" if self.prefs.markdown else "plain tokens"), timeout=2)

    def action_toggle_boundaries(self) -> None:
        self.prefs.token_boundaries = not self.prefs.token_boundaries
        if self.prefs.token_boundaries and self.prefs.markdown:
            self.notify("Token boundaries show on plain replies: F4 turns Markdown off", timeout=4)
        self._save_prefs()
        self._rebuild_all()

    def action_toggle_colours(self) -> None:
        self.prefs.prob_colours = not self.prefs.prob_colours
        if self.prefs.prob_colours and self.prefs.markdown:
            self.notify("Colours show on plain replies: F4 turns Markdown off", timeout=4)
        self._save_prefs()
        self.query_one("#legend").display = self.prefs.prob_colours
        self._rebuild_all()

    def action_toggle_completion_space(self) -> None:
        self.prefs.completion_space = not self.prefs.completion_space
        self._save_prefs()
        if self.session.model_ready:
            self.prompt.placeholder = self._placeholder()
        on = "a space before it when it would glue to a word" if self.prefs.completion_space else "exactly as typed"
        self.notify(f"Completion mode: your text is appended {on}", timeout=3)

    def action_toggle_wire(self) -> None:
        self.prefs.wire_view = not self.prefs.wire_view
        self._save_prefs()
        self.show_wire_view(self.prefs.wire_view)

    def action_toggle_document(self) -> None:
        """The transcript ⇄ the document the model reads (the selected token's reply, or
        the latest); the document's cursor keys work while it shows."""
        doc = self.document
        on = not doc.display
        doc.display = on
        self.transcript.display = not on
        self.query_one("#legend").display = self.prefs.prob_colours and not on
        if on:
            doc.return_focus = self.focused  # the message box, or the step mode's die bar
            self._refresh_panel()
            doc.body.focus()
        else:
            doc.show(None)  # its rows go: made again, for the reply of the moment, next time
            back = doc.return_focus
            if doc.body.has_focus or self.focused is None:  # (else something took it meanwhile)
                if self.session.stopped and self.step_bar.display:  # the die's keys (it stopped meanwhile)
                    back = self.step_bar
                if back is None or not (back.is_attached and back.display and back.focusable):
                    back = self.transcript if self.prompt.disabled else self.prompt  # a replay: no box
                back.focus()

    def action_toggle_wire_fold(self) -> None:
        self.prefs.wire_folded = not self.prefs.wire_folded
        self._save_prefs()
        self.wire.fold = self.prefs.wire_folded
        self.wire.redraw()
        if not self.prefs.wire_view:
            self.notify(
                "Wire view: long values " + ("folded" if self.prefs.wire_folded else "shown whole") + " (F10 shows it)",
                timeout=3,
            )

    def action_help(self) -> None:
        from loopchat.tui.help_screen import HelpScreen

        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
        else:
            self.push_screen(HelpScreen())

    # ---- token selection ------------------------------------------------------------
    def action_token_cursor(self, direction: int) -> None:
        try:
            target = self.session.next_token(self.selection, direction)
        except Refused as exc:
            self.notify(str(exc), timeout=2)
            return
        if target is not None:
            self.action_select_token(*target)
        elif self.selection is not None:  # off the end: no token selected (never a stop)
            self.selection = None
            self._clear_selection_views()
            self._refresh_panel()

    def action_select_token(self, reply: int, step: int) -> None:
        self.selection = (reply, step)
        for view in self.transcript.reply_views():
            if view.shows(reply):
                view.select(step, reply)
                self.transcript.scroll_to_block(view)
            elif view.selected is not None:
                view.select(None)
        self._refresh_panel()

    def _clear_selection_views(self) -> None:
        for view in self.transcript.reply_views():
            if view.selected is not None:
                view.select(None)

    async def action_quit(self) -> None:
        """Ctrl+Q: quit; with a draft in the message box, first say so once (Ctrl+Q
        again quits: the draft is not kept). A draft changed since asks again."""
        prompt = self.prompt
        draft = "" if prompt.disabled else prompt.value
        if draft and self._quit_asked_for != draft:
            self._quit_asked_for = draft
            self.notify(f"The box holds {len(draft):,} characters: Ctrl+Q again quits", severity="warning", timeout=6)
            return
        self._stop_backend()
        self.exit(0)
