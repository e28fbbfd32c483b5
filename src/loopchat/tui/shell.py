"""The chat app's shell: composition, the frame timer and message routing (app.py adds
the keys' actions and the widgets' and screens' answers).

The backend's events land in an EventPump (a deque) on the backend's thread; a timer
drains it FRAME_RATE times a second, the ChatSession (chat/session.py) applies them to
the conversation, and the frame shows what changed: the transcript's side through
ReplyViews (reply_views.py), the loop panel or the wire view, the die bar (step_mode.py),
the store's side through HistoryLink (chat/history_link.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Header, Static

from loopchat.backends import Backend
from loopchat.chat.conversation import Conversation, ReplyRecord
from loopchat.chat.event_pump import FRAME_RATE, TEXT_EVERY, EventPump
from loopchat.chat.history_link import HistoryLink
from loopchat.chat.history_recorder import HistoryRecorder
from loopchat.chat.prefs import Prefs, load_prefs, save_prefs
from loopchat.chat.replay_check import check_replay
from loopchat.chat.session import ChatSession, Refused, Update
from loopchat.model_files import shown_model_name
from loopchat.settings import SamplingSettings, SettingsError
from loopchat.trace import CUT_SHORT
from loopchat.tui.blocks import ReplyView
from loopchat.tui.document_view import DocumentView
from loopchat.tui.footer import WholeKeysFooter
from loopchat.tui.lens_colours import depth_frame, legend_for
from loopchat.tui.loop_panel import LoopPanel, PanelView
from loopchat.tui.prompt import PromptArea
from loopchat.tui.render import default_screen, driver_class, fallback_reason
from loopchat.tui.reply_views import ReplyViews
from loopchat.tui.signals import exit_on_signals
from loopchat.tui.step_mode import StepBar
from loopchat.tui.token_styles import legend_text
from loopchat.tui.transcript import Transcript
from loopchat.tui.wire_view import WireView

#: Below this terminal width the loop panel moves under the transcript (compact form).
NARROW_WIDTH = 100

T = TypeVar("T")


@dataclass(frozen=True)
class Notice:
    """A notification the app showed (`app.notices`): what it said, its title, its severity."""

    message: str
    title: str = ""
    severity: str = "information"


class ChatShell(App[int]):
    CSS_PATH = "styles.tcss"
    TITLE = "loopchat"
    ENABLE_COMMAND_PALETTE = True

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
        #: the transcript's view of each reply (reply_views.py)
        self.replies = ReplyViews(self.session, self.prefs, lambda: self.transcript)
        self.selection: tuple[int, int] | None = None
        self.knob = "temperature"
        self.narrow = False  # below NARROW_WIDTH columns: the panel goes under the transcript
        self.handle_signals = False  # run_tui: SIGTERM / SIGHUP quit like Ctrl+Q
        self._panel_dirty = True
        #: the wire view (F10), held here: the frame asks it every time whether it needs drawing
        self.wire = WireView(id="wire")
        #: the conversation store (a None path: history off for this run); the recorder
        #: writes to it through its writer's thread while the History pref is on
        self.store = HistoryLink(history_path, lambda: self.session, self.notify)
        #: the notifications shown since the last clear_notifications, in order
        self.notices: list[Notice] = []
        #: called with each notice as it is shown (tests record them)
        self.notice_listeners: list[Callable[[Notice], None]] = []
        # for tests and benchmarks
        self.run_finished = asyncio.Event()
        self.model_ready = asyncio.Event()
        self.frames_rendered = 0
        self.last_error: str | None = None
        self.change_made_after_steps: int | None = None
        self.depth_probe: Any = None  # the lens depths being read (Shift+F7, lens_colours.py)
        self.depth_asked: set[int] = set()  # replies whose depths were asked for

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
    def step_bar(self) -> StepBar:
        return self.query_one(StepBar)

    @property
    def views(self) -> dict[ReplyRecord, ReplyView]:
        """The block that shows each reply."""
        return self.replies.by_reply

    @property
    def history(self) -> HistoryRecorder | None:
        """The conversation store's recorder (None: history off)."""
        return self.store.recorder

    @property
    def history_error(self) -> str | None:
        return self.store.error

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
            exit_on_signals(self.quit_now)
        self.backend.attach(self.pump.emit)
        self.store.start(self.prefs.history)
        self.document.display = False
        self.show_legend()
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

    # ------------------------------------------------------------- notices ----
    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: Any = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Textual's notify, each notice kept in `notices` and told to `notice_listeners`
        (thread-safe as Textual's: a list append)."""
        notice = Notice(str(message), title, severity)
        self.notices.append(notice)
        for listener in list(self.notice_listeners):
            listener(notice)
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    def clear_notifications(self) -> None:
        self.notices.clear()
        super().clear_notifications()

    def ask(self, call: Callable[[], T], *, severity: Any = "warning", timeout: float | None = None) -> T | None:
        """`call()`'s answer; None if the session refused (it says why, as a notice)."""
        try:
            return call()
        except Refused as exc:
            self.notify(str(exc), severity=severity, timeout=timeout)
            return None

    def allowed(self, call: Callable[[], None], *, severity: Any = "warning", timeout: float | None = None) -> bool:
        """`call()` done; False if the session refused (it says why, as a notice)."""
        try:
            call()
        except Refused as exc:
            self.notify(str(exc), severity=severity, timeout=timeout)
            return False
        return True

    # ------------------------------------------------------------- frames ----
    def show_legend(self) -> None:
        """The colours' legend above the transcript, for the colouring on (if any)."""
        legend = legend_for(self.prefs, self.depth_probe, self.session.last_done_reply())
        w = self.query_one("#legend", Static)
        w.display = legend is not None and not self.document.display
        if legend is not None:
            w.update(legend)

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
        self.store.poll()
        events = self.pump.drain()
        depth_frame(self)  # Shift+F7's lens depths that came, and the next reply's asked for
        if not events:
            self.replies.add_steps(self.session.take_text())  # tokens held back by the last frame (a slow model)
            view = self.replies.get(self.current) if self.generating else None
            if view is not None:
                view.tick()
            if self._panel_dirty or (self.prefs.wire_view and self.wire.needs_frames):
                self._refresh_panel()
            return
        u = self.session.consume(events)
        self._show(u)
        self.store.record(u)
        self.sync_step_mode()
        if self.selection is None:
            self._refresh_panel()
        self.frames_rendered += 1

    def _show(self, u: Update) -> None:
        for user, rec in u.started:  # the turns of a played trace
            self.replies.add(rec, user)
            self.run_finished.clear()
        if u.ended or self.frames_rendered % TEXT_EVERY == 0:
            self.replies.add_steps(self.session.take_text())
        for message in u.warnings:
            self.notify(message, severity="warning", timeout=8)
        for err in u.errors:
            self._report_error(err.message, err.during)
        if u.loading is not None:
            self._update_subtitle()
        if u.ready is not None:
            self._model_ready()
        if u.dropped is not None:  # the prompt refused, or stopped before its first token: the turn goes
            self.replies.drop(u.dropped, u.shown_again)  # (a version: the one it replaced comes back)
        if u.restore_prompt:  # before anything typed since: nothing lost, nothing reordered
            draft = self.prompt.value
            self.prompt.value = u.restore_prompt + ("\n" + draft if draft else "")
        for rec in u.finished:
            differs = check_replay(rec, self.conversation)  # F9's replay: its tokens against the original's
            if differs:
                self.notify(differs, severity="warning", timeout=10, markup=False)
            view = self.replies.get(rec)
            if view is not None:
                view.finish()
        if u.ended:
            self.run_finished.set()
            self._panel_dirty = True

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
        self.panel.show(
            PanelView(
                record=rec,
                step=step,
                live=s.in_force(),
                knob=self.knob,
                pinned=pinned,
                generating=s.generating,
                compact=self.narrow,
                model=model,
                takes_messages=b.can_generate,
                pending=s.pending if s.stopped else None,
            )
        )

    def sync_step_mode(self) -> None:
        """Once a frame: the die bar shown while in step mode (or armed); the focus on it
        when the loop stops, back to the message box when step mode ends."""
        s = self.session
        bar = self.step_bar
        if not s.stepping and bar.has_focus:  # (also when a search closed after the reply ended)
            self.prompt.focus()
        change = bar.sync(s)
        if change is None:
            return
        stopped, was_stopped = change
        self.document.stopped_before = s.pending.index if stopped and s.pending is not None else None
        view = self.replies.get(s.current)
        if view is not None and view.step_stopped != stopped:
            view.step_stopped = stopped  # its "first token…" spinner stops: the loop waits for a key
            view.tick()
        self._panel_dirty = True
        if (
            stopped
            and not was_stopped
            and self.screen is self.screen_stack[0]
            and self.focused is not bar
            and not self.document.body.has_focus  # (the document view takes the die's keys too)
        ):
            bar.focus()

    # ------------------------------------------------------------- replies ----
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

    def save_prefs(self) -> None:
        error = save_prefs(self.prefs, self.prefs_path)
        if error:
            self.notify(error, severity="warning")

    # ---------------------------------------------------------------- exit ----
    def stop_backend(self) -> None:
        self.store.stop()
        self.session.close()
        if self.owns_backend:
            self.backend.close()
        else:
            self.backend.attach(None)

    def quit_now(self) -> None:
        """Quit at once (SIGTERM, SIGHUP; Ctrl+Q once the draft question is answered)."""
        self.stop_backend()
        self.exit(0)

    def on_unmount(self) -> None:
        self.stop_backend()
