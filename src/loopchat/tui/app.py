"""The loopchat Textual app: transcript, loop panel, message box (made and run by launch.py).

A thin shell: the backend's events land in an EventPump (a deque) on the backend's
thread; a timer drains it FRAME_RATE times a second, the ChatSession (session.py)
applies them to the conversation, and the frame shows what changed. Keys call the
session and show its answer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Header, Static

from loopchat.backends import Backend
from loopchat.chat.conversation import BLOCKING, STREAM, Conversation, ReplyRecord, with_space
from loopchat.chat.event_pump import FRAME_RATE, TEXT_EVERY, EventPump
from loopchat.chat.history_recorder import HistoryRecorder
from loopchat.chat.prefs import Prefs, load_prefs, save_prefs
from loopchat.chat.replay_check import check_replay
from loopchat.chat.session import ChatSession, Refused, Update
from loopchat.events import Step
from loopchat.model_files import shown_model_name
from loopchat.settings import SamplingSettings, SettingsError
from loopchat.trace import CUT_SHORT
from loopchat.tui.branch_actions import BranchActions
from loopchat.tui.document_view import DocumentView
from loopchat.tui.footer import WholeKeysFooter
from loopchat.tui.history_actions import HistoryActions
from loopchat.tui.keys import BINDINGS, KeyActions
from loopchat.tui.loop_panel import LoopPanel, PanelView
from loopchat.tui.palette import own_system_commands
from loopchat.tui.prompt import PromptArea, TypedForTheBox
from loopchat.tui.render import default_screen, driver_class, fallback_reason
from loopchat.tui.step_mode import StepActions, StepBar
from loopchat.tui.token_styles import legend_text
from loopchat.tui.transcript import ReplyView, Transcript
from loopchat.tui.wire_view import WireView

#: Below this terminal width the loop panel moves under the transcript (compact form).
NARROW_WIDTH = 100


class LoopChatApp(BranchActions, StepActions, HistoryActions, KeyActions, App[int]):
    CSS_PATH = "styles.tcss"
    TITLE = "loopchat"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = BINDINGS

    def __init__(
        self,
        backend: Backend,
        *,
        prefs: Prefs | None = None,
        prefs_path: Path | None = None,
        owns_backend: bool = True,
        settings: SamplingSettings | None = None,
        history_path: Path | None = None,
        mode: str | None = None,
    ) -> None:
        super().__init__()
        self.backend = backend
        self.owns_backend = owns_backend
        self.prefs_path = prefs_path
        self.prefs = prefs or load_prefs(prefs_path)
        self.session = ChatSession(backend, settings, mode=mode)
        self.pump = EventPump()
        self.views: dict[ReplyRecord, ReplyView] = {}
        #: the blocks shown after a version of a reply that another version replaced (branch_actions.py)
        self._tails: dict[ReplyRecord, list] = {}
        self.selection: tuple[int, int] | None = None
        self.knob = "temperature"
        self.narrow = False  # below NARROW_WIDTH columns: the panel goes under the transcript
        self.handle_signals = False  # run_tui: SIGTERM / SIGHUP quit like Ctrl+Q
        self._panel_dirty = True
        self._quit_asked_for: str | None = None  # the draft Ctrl+Q last said would be lost
        #: the wire view (F10), held here: the frame asks it every time whether it needs drawing
        self.wire = WireView(id="wire")
        #: the conversation store (None: history off for this run); the recorder writes
        #: to it through its writer's thread while the History pref is on
        self.history_path = history_path
        self.history: HistoryRecorder | None = None
        self.history_error: str | None = None  # why history went off (the store's one line)
        self._history_notices: deque[str] = deque()  # the writer's failures, for the frame
        # for tests and benchmarks
        self.run_finished = asyncio.Event()
        self.model_ready = asyncio.Event()
        self.frames_rendered = 0
        self.last_error: str | None = None
        self.change_made_after_steps: int | None = None

    # ------------------------------------------------------------- layout ----
    def get_default_screen(self) -> Screen:
        return default_screen(id="_default")  # LoopScreen, or Textual's own (render/)

    def get_driver_class(self) -> Any:
        return driver_class() or super().get_driver_class()  # a bracketed paste read whole (render/)

    def compose(self) -> ComposeResult:
        yield Header(icon="⟳")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield Static(legend_text(), id="legend")
                yield Transcript(id="transcript")
                yield DocumentView(id="document")  # Ctrl+T shows it in the transcript's place
            yield LoopPanel(id="panel")
            yield self.wire  # F10 shows it in the panel's place
        yield StepBar(id="stepbar")  # step mode (F12): holds the focus while the loop is stopped
        yield PromptArea(placeholder="Loading the model… (you can type already)", id="prompt")
        yield WholeKeysFooter(compact=True)

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def document(self) -> DocumentView:
        return self.query_one(DocumentView)

    @property
    def panel(self) -> LoopPanel:
        return self.query_one(LoopPanel)

    @property
    def prompt(self) -> PromptArea:
        return self.query_one("#prompt", PromptArea)

    @property
    def conversation(self) -> Conversation:
        return self.session.conversation

    @property
    def current(self) -> ReplyRecord | None:
        return self.session.current

    @property
    def generating(self) -> bool:
        return self.session.generating

    @property
    def steps_seen(self) -> int:
        return self.session.steps_seen

    def on_mount(self) -> None:
        if self.handle_signals:
            from loopchat.tui.launch import exit_on_signals

            exit_on_signals(self)
        self.backend.attach(self.pump.emit)
        self._start_history()
        self.query_one("#legend").display = self.prefs.prob_colours
        self.document.display = False
        self.show_wire_view(self.prefs.wire_view)
        self.set_interval(1 / FRAME_RATE, self._frame, name="frame")
        self.prompt.focus()
        placeholder = self.backend.placeholder()
        if placeholder:
            self.prompt.placeholder = placeholder
            self.prompt.disabled = True
        self._update_subtitle()
        self.backend.start()
        if self.backend.ready is not None:  # a model loaded before this app (a shared backend)
            self._model_ready()
        self._refresh_panel()
        if reason := fallback_reason():  # an untested Textual: stock rendering (render/)
            self.notify(reason, severity="warning", timeout=8)

    def on_resize(self, event: Any) -> None:
        # self.size is still the old size here: the event carries the new one
        self.narrow = event.size.width < NARROW_WIDTH
        self.screen.set_class(self.narrow, "-narrow")
        self._panel_dirty = True

    def _update_subtitle(self) -> None:
        mode = "streaming" if self.prefs.streaming else "blocking"
        b = self.backend
        if self.session.completion:
            mode = "completion · " + mode
        if not b.can_generate:
            self.sub_title = f"replay · {shown_model_name(b.name)}"
        elif b.loading:
            self.sub_title = f"loading {shown_model_name(b.loading)}… · {mode}"
        else:
            self.sub_title = f"{shown_model_name(b.name) or 'no model loaded'} · {mode}"

    def _model_ready(self) -> None:
        self.session.model_ready = True
        self.prompt.placeholder = self._placeholder()
        self._update_subtitle()
        self.model_ready.set()
        self._panel_dirty = True

    def _placeholder(self) -> str:
        name = shown_model_name(self.backend.name)
        if self.session.completion:
            if self.prefs.completion_space:
                return f"Text for {name} to continue, appended as typed (a space first if it would glue to a word)"
            return f"Text for {name} to continue, appended exactly as typed; Enter: it continues (empty: more)"
        return f"Message {name} — Enter sends, Ctrl+J new line"

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from own_system_commands(self, super().get_system_commands(screen))
        for name in self.backend.model_names:
            current = " (current)" if name == self.backend.name else ""
            yield SystemCommand(
                f"Switch model: {name}{current}", self.backend.describe(name), lambda n=name: self.switch_model(n)
            )
        yield from self.key_commands()
        yield from self.branch_commands()

    # ------------------------------------------------------------- frames ----
    def _frame(self) -> None:
        try:
            self._frame_body()
        except NoMatches:
            # the app is closing: its widgets went before the frame timer stopped
            # (a frame that came then failed on the panel, and the app's exit with it)
            if self.is_running and self.screen.is_attached and self.query(LoopPanel):
                raise

    def _frame_body(self) -> None:
        self.backend.flush()  # what the engine process sent since the last frame
        if self._history_notices:
            self._history_failed(self._history_notices.popleft())
        events = self.pump.drain()
        if not events:
            self._draw_text()  # tokens held back by the last frame (a slow model)
            view = self.views.get(self.current) if self.generating else None
            if view is not None:
                view.tick()
            if self._panel_dirty or (self.prefs.wire_view and self.wire.needs_frames):
                self._refresh_panel()
            return
        u = self.session.consume(events)
        self._show(u)
        self._record(u)
        self.sync_step_mode()
        if self.selection is None:
            self._refresh_panel()
        self.frames_rendered += 1

    def _show(self, u: Update) -> None:
        for user, rec in u.started:  # the turns of a played trace
            self.views[rec] = self.transcript.add_turn(user, rec, self.prefs, self.conversation)
            self.run_finished.clear()
        if u.ended or self.frames_rendered % TEXT_EVERY == 0:
            self._draw_text()
        for message in u.warnings:
            self.notify(message, severity="warning", timeout=8)
        for err in u.errors:
            self._report_error(err.message, err.during)
        if u.loading is not None:
            self._update_subtitle()
        if u.ready is not None:
            self._model_ready()
        if u.dropped is not None:  # the prompt refused, or stopped before its first token: the turn goes
            self.transcript.drop_turn(self.views.pop(u.dropped, None), self.prefs, self.conversation)
        if u.restore_prompt:  # before anything typed since: nothing lost, nothing reordered
            draft = self.prompt.value
            self.prompt.value = u.restore_prompt + ("\n" + draft if draft else "")
        for rec in u.finished:
            differs = check_replay(rec, self.conversation)  # F9's replay: its tokens against the original's
            if differs:
                self.notify(differs, severity="warning", timeout=10, markup=False)
            view = self.views.get(rec)
            if view is not None:
                view.finish()
        if u.ended:
            self.run_finished.set()
            self._panel_dirty = True

    def _draw_text(self) -> None:
        """Append the streamed tokens not yet drawn to their replies' views."""
        for rec, steps in self.session.take_text():
            view = self.views.get(rec)
            if view is not None:
                view.add_steps(steps)

    def _refresh_panel(self) -> None:
        self._panel_dirty = False
        s = self.session
        rec, step, pinned = s.shown_step(self.selection)
        if self.document.display:  # Ctrl+T: the selected token's reply, else the latest
            self.document.show(rec, step.index if pinned and step is not None else None)
        if self.prefs.wire_view:  # the wire in the panel's place: the panel is not drawn
            self.wire.show(rec, step.index if pinned and step is not None else None, s.generating)
            return
        b = self.backend
        model = f"{b.loading} (loading…)" if b.loading else (b.name or "none loaded")
        live = s.in_force()
        self.panel.show(
            PanelView(
                record=rec,
                step=step,
                live=live,
                knob=self.knob,
                pinned=pinned,
                generating=s.generating,
                compact=self.narrow,
                model=model,
                takes_messages=b.can_generate,
                pending=s.pending if s.stopped else None,
            )
        )

    # ------------------------------------------------------------- replies ----
    def on_prompt_area_submitted(self, event: PromptArea.Submitted) -> None:
        if not self.session.takes(event.text):  # (completion mode: an empty Enter continues)
            return
        mode = STREAM if self.prefs.streaming else BLOCKING
        text = event.text
        if self.session.completion and self.prefs.completion_space:
            text = with_space(self.conversation.document(), text)
        try:
            rec = self.session.send(text, mode)
        except Refused as exc:
            self.notify(str(exc), severity="warning")
            return
        self.selection = None
        self._clear_selection_views()
        self.prompt.value = ""
        if self.history is not None:
            self.history.sent(rec, text)
        self._show_new_reply(rec, text.strip())

    def _show_new_reply(self, rec: ReplyRecord, user_text: str | None = None) -> None:
        """A new reply in the transcript (after the message `user_text`, or the document)."""
        self.views[rec] = self.transcript.add_turn(user_text, rec, self.prefs, self.conversation)
        self.transcript.anchor()
        self.run_finished.clear()
        self._panel_dirty = True

    def switch_model(self, name: str) -> None:
        try:
            self.session.switch_model(name)
        except Refused as exc:
            self.notify(str(exc), severity="warning")
            return
        self.model_ready.clear()
        self.prompt.placeholder = f"Loading {name}… (you can type already)"
        self.notify(f"Loading model {name}…", timeout=3)
        self._update_subtitle()
        self._panel_dirty = True

    def _report_error(self, message: str, during: str) -> None:
        """The one error handler: notify, keep the app running."""
        self.last_error = message
        title = {"load": "Model failed to load"}.get(during, "Generation failed")
        if message == CUT_SHORT:
            title = "Trace cut short"
        self.notify(message, title=title, severity="error", timeout=12)
        if during == "load":
            self.model_ready.clear()
            self.prompt.placeholder = "No model loaded — pick one with Ctrl+P → Switch model (you can type already)"
            self._update_subtitle()
            self._panel_dirty = True

    def steps_emitted(self) -> int:
        """Steps of the current reply the engine has emitted so far (drawn or queued)."""
        self.backend.flush()
        drawn = len(self.current.steps) if self.current is not None else 0
        return drawn + sum(1 for e in self.pump.snapshot() if isinstance(e, Step))

    def set_setting(self, **changes: Any) -> bool:
        """Change settings (validated): the next reply's, and the reply in flight's."""
        try:
            self.session.change_settings(**changes)
        except SettingsError as exc:
            self.notify(str(exc), severity="error")
            return False
        self._panel_dirty = True
        return True

    def show_wire_view(self, on: bool) -> None:
        """The wire view (on) or the loop panel in the side panel's place."""
        self.wire.fold = self.prefs.wire_folded
        self.wire.display = on
        self.panel.display = not on
        self._refresh_panel()

    def on_wire_view_fold_toggled(self, message: WireView.FoldToggled) -> None:
        self.action_toggle_wire_fold()

    def _save_prefs(self) -> None:
        error = save_prefs(self.prefs, self.prefs_path)
        if error:
            self.notify(error, severity="warning")

    # ---------------------------------------------------------------- exit ----
    def _stop_backend(self) -> None:
        self._stop_history()
        self.session.close()
        if self.owns_backend:
            self.backend.close()
        else:
            self.backend.attach(None)

    def on_unmount(self) -> None:
        self._stop_backend()

    def on_transcript_token_selected(self, message: Transcript.TokenSelected) -> None:
        self.action_select_token(message.reply, message.step)

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

    def on_document_view_step_under_cursor(self, message: DocumentView.StepUnderCursor) -> None:
        self.action_select_token(message.reply, message.step)  # the panel shows that step
