"""What the chat shows: a new reply, another version, a whole conversation; and the keys
that change what it shows, not what the model does: the display prefs
(F3, F4, F6, F7, F10, the completion-mode space), the document view (Ctrl+T), the keys
list (F1), the token cursor (Alt+←/→) and a token selected. A layer of the app class
over the shell (shell.py); app.py adds the requests to the session.
"""

from __future__ import annotations

from loopchat.chat.conversation import ReplyRecord
from loopchat.chat.session import Refused
from loopchat.tui.shell import ChatShell

#: F6's third state, said when it is turned on
BY_PASS = "Token boundaries by forward pass: one shade per pass; green: drafted tokens the pass kept (F6: off)"


class ChatViewKeys(ChatShell):
    # ---- replies shown -------------------------------------------------------------
    def show_new_reply(self, rec: ReplyRecord, user_text: str | None = None) -> None:
        """A new reply in the transcript (after the message `user_text`, or the document)."""
        self.replies.show_new(rec, user_text)
        self.run_finished.clear()
        self._panel_dirty = True

    def show_version(self, old: ReplyRecord, new: ReplyRecord) -> None:
        """`new` in `old`'s place (another version of the reply), nothing selected."""
        self.selection = None
        self.replies.clear_selection()
        self.replies.swap_version(old, new)
        self._panel_dirty = True
        self._refresh_panel()

    def show_conversation(self, shown: list[tuple[str, ReplyRecord | None]] | None = None) -> None:
        """The session's conversation from its start (a new one: empty), nothing selected."""
        self.selection = None
        self.wire.forget()
        self.replies.reset()
        if shown:
            self.replies.show_restored(shown)
        self.run_finished.set()
        self._refresh_panel()

    # ---- preferences ----------------------------------------------------------------
    def action_toggle_streaming(self) -> None:
        self.prefs.streaming = not self.prefs.streaming
        self.save_prefs()
        self._update_subtitle()
        mode = (
            "streaming: tokens appear as they are drawn"
            if self.prefs.streaming
            else "blocking: the reply appears when complete"
        )
        self.notify(f"Next replies: {mode}", timeout=3)

    def action_toggle_markdown(self) -> None:
        self.prefs.markdown = not self.prefs.markdown
        self.save_prefs()
        self.replies.rebuild_all()
        self.notify("Finished replies: " + ("Markdown" if self.prefs.markdown else "plain tokens"), timeout=2)

    def action_toggle_boundaries(self) -> None:
        """F6: token boundaries off -> by token -> by forward pass (a draft's tokens) -> off."""
        p = self.prefs
        p.token_boundaries, p.token_passes = (False, True) if p.token_boundaries else (not p.token_passes, False)
        if p.token_passes:
            self.notify(BY_PASS, timeout=4)
        if (p.token_boundaries or p.token_passes) and p.markdown:
            self.notify("Token boundaries show on plain replies: F4 turns Markdown off", timeout=4)
        self.save_prefs()
        self.replies.rebuild_all()

    def action_toggle_colours(self) -> None:
        self.prefs.prob_colours = not self.prefs.prob_colours
        self.prefs.lens_colours = False  # one colouring at a time
        self._colours_changed(self.prefs.prob_colours)

    def action_toggle_lens_colours(self) -> None:
        """Shift+F7: colour tokens by their lens depth (chat/lens_depth.py), read now for the
        shown reply (the selected token's, else the last), then for each new reply."""
        self.prefs.lens_colours = not self.prefs.lens_colours
        self.prefs.prob_colours = False
        if self.prefs.lens_colours:
            self.read_lens_depths(self.selection)
        else:
            self.session.stop_lens_depths()
        self._colours_changed(self.prefs.lens_colours)

    def read_lens_depths(self, selection: tuple[int, int] | None, quiet: bool = False) -> None:
        """Ask for the lens depths of the shown reply's tokens not known yet (lens_colours.py)."""
        try:
            probe = self.session.lens_depths(selection)
        except Refused as exc:
            if not quiet:
                self.notify(str(exc), timeout=4)
            return
        if probe is not None:
            self.depth_probe = probe
            self.depth_asked.add(probe.rec.number)
        self.show_legend()

    def _colours_changed(self, on: bool) -> None:
        if on and self.prefs.markdown:
            self.notify("Colours show on plain replies: F4 turns Markdown off", timeout=4)
        self.save_prefs()
        self.show_legend()
        self.replies.rebuild_all()

    def action_toggle_forced(self) -> None:
        self.prefs.forced_marks = not self.prefs.forced_marks
        self.save_prefs()
        self.replies.rebuild_all()
        on = "marked (blue italics): one token allowed, the model had no say" if self.prefs.forced_marks else "unmarked"
        self.notify(f"Tokens a constraint forced: {on}", timeout=3)
        if self.prefs.forced_marks and self.prefs.markdown:
            self.notify("The marks show on plain replies: F4 turns Markdown off", timeout=4)

    def action_set_draft(self, source: str) -> None:
        """The palette's Draft entries: the draft of the next passes, set as F2 sets its row."""
        if self.set_setting(draft=source):
            note = self.session.settings_note()
            what = "one token per forward pass" if source == "off" else "drafted tokens, checked by one pass"
            self.notify(note or f"Draft: {source} ({what})", timeout=3)
            self._refresh_panel()

    def action_constraint(self) -> None:
        from loopchat.tui.constraint_dialog import ConstraintDialog

        def done(picked: tuple | None) -> None:
            if picked is not None:
                c = self.session.constraint = picked[0]
                self.notify(f"Next replies follow: {c.label()}" if c else "Next replies: no constraint", timeout=3)

        self.push_screen(ConstraintDialog(self.session.constraint), done)

    def action_toggle_completion_space(self) -> None:
        self.prefs.completion_space = not self.prefs.completion_space
        self.save_prefs()
        if self.session.model_ready:
            self.prompt.placeholder = self._placeholder()
        on = "a space before it when it would glue to a word" if self.prefs.completion_space else "exactly as typed"
        self.notify(f"Completion mode: your text is appended {on}", timeout=3)

    def action_toggle_wire(self) -> None:
        self.prefs.wire_view = not self.prefs.wire_view
        self.save_prefs()
        self.show_wire_view(self.prefs.wire_view)

    def action_toggle_wire_fold(self) -> None:
        self.prefs.wire_folded = not self.prefs.wire_folded
        self.save_prefs()
        self.wire.fold = self.prefs.wire_folded
        self.wire.redraw()
        if not self.prefs.wire_view:
            self.notify(
                "Wire view: long values " + ("folded" if self.prefs.wire_folded else "shown whole") + " (F10 shows it)",
                timeout=3,
            )

    # ---- views ----------------------------------------------------------------------
    def action_toggle_document(self) -> None:
        """The transcript ⇄ the document the model reads (the selected token's reply, or
        the latest); the document's cursor keys work while it shows."""
        doc = self.document
        on = not doc.display
        doc.display = on
        self.session.read_prompt = on  # the replies sent meanwhile: their prompts scored
        self.transcript.display = not on
        self.show_legend()
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

    def action_lens(self) -> None:
        """F11: the logit lens of the pass the panel shows, computed now (session_lens.py)."""
        from loopchat.tui.lens_screen import LensScreen

        try:
            probe = self.session.lens(self.selection)
        except Refused as exc:
            self.notify(str(exc), timeout=4)
            return
        self.push_screen(LensScreen(probe, self.session))

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
            self.replies.clear_selection()
            self._refresh_panel()

    def action_select_token(self, reply: int, step: int) -> None:
        self.selection = (reply, step)
        self.replies.select(reply, step)
        self._refresh_panel()
