"""The loopchat Textual app (made and run by launch.py): the shell (shell.py) with the
keys' actions (keys.py binds them), the widgets' messages and the screens' results, each
passed to the session (chat/session.py) and its answer shown.

The die bar posts StepBar.StepRequested / TokenPicked / SearchRequested (step_mode.py);
the transcript and the document view post the token clicked or under the cursor; the
branch picker returns the token to branch with, the history list the conversation to
open, the settings dialog the new settings, the token search the token to pick.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from textual.actions import parse as parse_action
from textual.app import SystemCommand
from textual.screen import Screen

from loopchat.browser import browser_copy_refusal, clipboard_allowed, web_url
from loopchat.chat.conversation import BLOCKING, STREAM, with_space
from loopchat.events import Step
from loopchat.settings import KNOBS, SETTING, SamplingSettings
from loopchat.tui import batch_keys
from loopchat.tui.branch_picker import BranchChoice, BranchPicker
from loopchat.tui.document_view import DocumentView
from loopchat.tui.keys import BINDINGS, command_table
from loopchat.tui.palette import own_system_commands
from loopchat.tui.prompt import PromptArea, TypedForTheBox
from loopchat.tui.shell import Notice
from loopchat.tui.step_mode import StepBar, TokenSearch, listed_faces
from loopchat.tui.transcript import Transcript
from loopchat.tui.view_keys import ChatViewKeys
from loopchat.tui.wire_view import WireView

__all__ = ["LoopChatApp", "Notice"]


class LoopChatApp(ChatViewKeys):
    BINDINGS = BINDINGS
    _quit_asked_for: str | None = None  # the draft Ctrl+Q last said would be lost

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from own_system_commands(self, super().get_system_commands(screen))
        for name in self.backend.model_names:
            current = " (current)" if name == self.backend.name else ""
            yield SystemCommand(
                f"Switch model: {name}{current}", self.backend.describe(name), lambda n=name: self.switch_model(n)
            )
        yield from self.key_commands()

    def key_commands(self) -> Iterable[SystemCommand]:
        """The command palette's entries for the keys (keys.command_table)."""
        p = self.prefs
        draft = getattr(self.session.settings, "draft", None)  # (None: no draft row in the settings table)
        table = command_table(
            completion=self.session.completion, completion_space=p.completion_space, history=p.history, draft=draft
        )
        for title, help_text, action in table:
            _, name, params = parse_action(action)
            yield SystemCommand(title, help_text, partial(getattr(self, f"action_{name}"), *params))

    def _mode(self) -> str:
        return STREAM if self.prefs.streaming else BLOCKING

    # ---- the widgets' messages --------------------------------------------------------
    def on_prompt_area_submitted(self, event: PromptArea.Submitted) -> None:
        if not self.session.takes(event.text):  # (completion mode: an empty Enter continues)
            return
        text = event.text
        if self.session.completion and self.prefs.completion_space:
            text = with_space(self.conversation.document(), text)
        rec = self.ask(lambda: self.session.send(text, self._mode()))
        if rec is None:
            return
        self.selection = None
        self.replies.clear_selection()
        self.prompt.value = ""
        if self.history is not None:
            self.history.sent(rec, text)
        self.show_new_reply(rec, text.strip())

    def on_transcript_token_selected(self, message: Transcript.TokenSelected) -> None:
        self.action_select_token(message.reply, message.step)

    def on_document_view_step_under_cursor(self, message: DocumentView.StepUnderCursor) -> None:
        self.action_select_token(message.reply, message.step)  # the panel shows that step

    def on_wire_view_fold_toggled(self, message: WireView.FoldToggled) -> None:
        self.action_toggle_wire_fold()

    def on_typed_for_the_box(self, message: TypedForTheBox) -> None:
        """Typing after a click in the transcript or in the document view: into the message
        box (it was lost), or, with the loop stopped in step mode, to the die bar's keys
        (Enter, n, 1–9, /)."""
        if self.session.stopped and self.step_bar.display:
            self.step_bar.focus()
            self.simulate_key(message.key)
        elif message.text and not self.prompt.disabled:  # (a replay has no box)
            self.prompt.focus()
            self.prompt.insert(message.text)

    def on_prompt_area_scroll_requested(self, message: PromptArea.ScrollRequested) -> None:
        """PgUp/PgDn, Ctrl+Home/End in the message box: scroll the transcript (or the
        document view in its place); scrolling up leaves the reply's end (anchor)."""
        view = self.document.body if self.document.display else self.transcript
        scroll = {
            "page_up": view.scroll_page_up,
            "page_down": view.scroll_page_down,
            "home": view.scroll_home,
            "end": view.scroll_end,
        }[message.how]
        scroll(animate=False)

    def on_step_bar_step_requested(self, message: StepBar.StepRequested) -> None:
        self.action_step_draw(message.n)

    def on_step_bar_token_picked(self, message: StepBar.TokenPicked) -> None:
        self.action_step_pick(message.rank)

    def on_step_bar_search_requested(self, message: StepBar.SearchRequested) -> None:
        self.action_step_search()

    # ---- the reply ----------------------------------------------------------------------
    def action_stop(self) -> None:
        if self.session.cancel():
            self.notify("Stopping…", timeout=1.5)
        elif self.selection is not None:
            self.selection = None
            self.replies.clear_selection()
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

    def action_regenerate(self) -> None:
        pinned = self.session.settings.seed
        pair = self.ask(lambda: self.session.regenerate(self._mode()))
        if pair is None:
            return
        old, new = pair
        if self.history is not None:
            self.history.regenerated(old, new)
        if pinned is None:
            self.notify("Regenerating with a new random seed", timeout=2)
        else:
            self.notify(f"Regenerating with seed {self.session.settings.seed} (the next after {pinned})", timeout=3)
        self.show_version(old, new)  # in its place: version n/n of the turn's reply
        self.run_finished.clear()

    def action_replies_n(self) -> None:  # Shift+F5 (batch_keys.py)
        batch_keys.write_n(self)

    def action_versions(self) -> None:  # Alt+V
        batch_keys.show_versions(self)

    def action_replay_other_mode(self) -> None:
        rec = self.ask(self.session.replay_other_mode)
        if rec is None:
            return
        original = self.conversation.reply(rec.replay_of) if rec.replay_of is not None else None
        if self.history is not None and original is not None:  # stored: a reopened conversation keeps the numbers
            self.history.replayed(original, rec)
        self.show_new_reply(rec)
        start = original.start if original is not None else None
        if original is not None and start is not None and start.source:  # a server may ignore the seed: say so
            self.notify(
                f"Replaying reply {original.number} with its seed {start.settings.seed} on {start.source}: a server "
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
        self.show_conversation()
        self.notify("New document" if self.session.completion else "New conversation", timeout=1.5)

    def action_toggle_completion(self) -> None:
        """Chat mode ⇄ completion mode (a conversation under way is left for a new one)."""
        left = bool(self.conversation.replies)
        message = self.ask(self.session.toggle_mode)
        if message is None:
            return
        if left:
            if self.history is not None:
                self.history.reset()
            self.show_conversation()
        self._update_subtitle()
        if self.session.model_ready:
            self.prompt.placeholder = self._placeholder()
        self.notify(message, timeout=4)

    def action_copy_reply(self) -> None:
        rec = self.session.last_done_reply()
        if rec is None:
            self.notify("No reply to copy yet", severity="warning")
            return
        page = web_url()
        if page is not None and not clipboard_allowed(page):
            self.notify(browser_copy_refusal(page), severity="warning", timeout=8)
            return
        self.copy_to_clipboard(rec.text)  # (in a browser tab: xterm.js hands it to the browser's clipboard)
        where = " to the browser's clipboard" if page is not None else ""
        self.notify(f"Copied reply {rec.number} ({len(rec.text)} characters){where}", timeout=2)

    def switch_model(self, name: str) -> None:
        if not self.allowed(lambda: self.session.switch_model(name)):
            return
        self.model_ready.clear()
        self.prompt.placeholder = f"Loading {name}… (you can type already)"
        self.notify(f"Loading model {name}…", timeout=3)
        self._update_subtitle()
        self._panel_dirty = True

    async def action_quit(self) -> None:
        """Ctrl+Q: quit; with a draft in the message box, first say so once (Ctrl+Q
        again quits: the draft is not kept). A draft changed since asks again."""
        prompt = self.prompt
        draft = "" if prompt.disabled else prompt.value
        if draft and self._quit_asked_for != draft:
            self._quit_asked_for = draft
            self.notify(f"The box holds {len(draft):,} characters: Ctrl+Q again quits", severity="warning", timeout=6)
            return
        self.quit_now()

    # ---- sampling settings ----------------------------------------------------------------
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

    def steps_emitted(self) -> int:
        """Steps of the current reply the engine has emitted so far (drawn or queued)."""
        self.backend.flush()
        drawn = len(self.current.steps) if self.current is not None else 0
        return drawn + sum(1 for e in self.pump.snapshot() if isinstance(e, Step))

    def action_settings(self) -> None:
        from loopchat.tui.settings_dialog import SettingsDialog

        def done(new: SamplingSettings | None) -> None:
            if new is not None:
                changes = {n: getattr(new, n) for n in new.diff(self.session.settings)}
                if self.set_setting(**changes) and changes and (note := self.session.settings_note()):
                    self.notify(note, timeout=4)
                if dialog.watch_texts is not None:
                    s.watch = dialog.watch_texts  # (the next replies: watch.py)
                self._refresh_panel()

        s = self.session
        dialog = SettingsDialog(
            s.settings,
            generating=self.generating,
            live=self.backend.live_settings,
            stopped=s.stopped,
            # the model's tokenizer where it runs in this process (a logit bias typed as text)
            tokenizer=getattr(self.backend, "tokenizer", lambda: None)(),
            watch=s.watch if self.backend.can_branch else None,  # (a model run here: tokens on watch)
        )
        self.push_screen(dialog, done)

    # ---- step mode (the die's keys: the die bar's messages, and the document view's) ------
    def action_step_mode(self) -> None:
        note = self.ask(self.session.toggle_step, timeout=4)
        if note is not None:
            self.notify(note, timeout=2)
            self.sync_step_mode()

    def action_step_draw(self, n: int) -> None:
        self.allowed(lambda: self.session.draw(n), severity="information", timeout=2)
        self.sync_step_mode()

    def action_step_pick(self, rank: int) -> None:
        self.ask(lambda: self.session.pick_rank(rank), severity="information", timeout=2)
        self.sync_step_mode()

    def action_watch(self) -> None:
        """The palette's "Tokens on watch" (watch_screen.py): followed in the next replies."""
        from loopchat.tui.watch_screen import WatchScreen

        def done(watch: tuple[str, ...] | None) -> None:
            if watch is not None:
                self.session.watch = watch
                said = ", ".join(repr(t) for t in watch)
                self.notify(f"Watching {said} from the next reply" if watch else "Nothing on watch", timeout=3)
                if watch and not self.backend.can_branch:
                    self.notify("Tokens on watch need a model run here: a server does not send them", timeout=5)

        self.push_screen(WatchScreen(self.session.watch), done)

    def action_step_search(self) -> None:
        s = self.session
        p = s.pending
        if p is None or not s.stopped:
            self.notify("The loop is not stopped: the search picks the token of a stopped draw", timeout=2)
            return
        vocabulary = self.backend.vocabulary()
        if not vocabulary:
            self.notify("This model's vocabulary is not available here", severity="warning")
            return

        def done(token: int | None) -> None:
            if token is not None:  # (refused: e.g. the reply was stopped meanwhile)
                self.allowed(lambda: s.pick(token), severity="information", timeout=2)
            self.call_after_refresh(self.sync_step_mode)  # after the focus came back from the search

        search = TokenSearch(vocabulary, self.backend.pending_probs, listed_faces(p.raw_top, p.sampled_top))
        self.push_screen(search, done)

    # ---- versions of a reply: Ctrl+R branches at the selected token, Alt+PgUp/PgDn --------
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
        if not self.allowed(self.session.check_can_run):  # refuse now what the session would after
            return
        self.push_screen(
            BranchPicker(reply, step, self.session.settings, self.backend.vocabulary()),
            lambda choice: self._branch(reply, index, choice),
        )

    def _branch(self, reply: int, index: int, choice: BranchChoice | None) -> None:
        if choice is None:
            return
        pair = self.ask(lambda: self.session.branch(reply, index, choice.token_id, self._mode()))
        if pair is None:
            return
        old, new = pair
        if self.history is not None:
            self.history.regenerated(old, new)
        what = f"“{choice.label}”" if choice.token_id is not None else "a new draw"
        self.notify(f"Branch: reply {old.number} from token {index + 1}, with {what}", timeout=3)
        self.show_version(old, new)
        self.run_finished.clear()

    def action_version(self, direction: int) -> None:
        """The versions of the selected token's reply (else of the last reply)."""
        reply = self.selection[0] if self.selection is not None else None
        pair = self.ask(lambda: self.session.switch_version(direction, reply))
        if pair is None:
            return
        old, new = pair
        self.show_version(old, new)
        if self.history is not None:
            last = self.conversation.last_in_history()
            if last is not None:
                self.history.switched(last)  # the next message hangs from the path shown
        k, n = new.version
        self.notify(f"Version {k}/{n} of the reply", timeout=1.5)

    # ---- the conversation store ---------------------------------------------------------
    def action_history(self) -> None:
        """Ctrl+O: the stored conversations; the list returns the one to open."""
        from loopchat.tui.history_screen import HistoryScreen

        if isinstance(self.screen, HistoryScreen):
            self.screen.dismiss(None)
            return
        h = self.history
        if h is None:
            self.notify(self.store.off_note(), severity="warning")
            return

        def delete(conversation_id: int) -> None:
            h.writer.delete(conversation_id)
            if h.forget(conversation_id):
                self.notify("The conversation on screen was deleted: the next message starts a new one", timeout=4)

        def chosen(conversation_id: int | None) -> None:
            if conversation_id is not None:
                self.open_stored(conversation_id)

        assert self.store.path is not None  # (a recorder writes to it)
        self.push_screen(
            HistoryScreen(self.store.path, rename=h.writer.rename, delete=delete, current=h.current_id()), chosen
        )

    def open_stored(self, conversation_id: int) -> bool:
        """Show the stored conversation and continue it (the current one is replaced)."""
        if self.generating:
            self.notify("Stop the reply first (Esc), then open a conversation", severity="warning")
            return False
        loaded = self.store.load(conversation_id)
        if loaded is None:
            return False
        restored, title = loaded
        if not self.allowed(lambda: self.session.open_conversation(restored.conversation)):
            return False
        self.show_conversation(restored.shown)
        self._update_subtitle()  # (the conversation's mode: chat, or completion for a document)
        if self.history is not None:
            self.history.opened(conversation_id, restored.tip, restored.replies)
        n = len(restored.conversation.replies)
        self.notify(f"“{title}”: {n} repl{'y' if n == 1 else 'ies'} · the next message continues it", timeout=4)
        return True

    def action_toggle_history(self) -> None:
        self.prefs.history = not self.prefs.history
        self.save_prefs()
        self.store.toggle(self.prefs.history)
