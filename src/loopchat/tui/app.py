"""The loopchat Textual app: transcript, loop panel, prompt; `run_tui` and `create_app`.

Events come from a backend (live EngineWorker or a recorded trace) into an EventPump
(a deque); a timer drains it at FRAME_RATE and renders once per frame.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from ..events import ContextTrimmed, Finish, FinishReason, Message, Prefill, Start, Step
from ..settings import LiveSettings, SamplingSettings, SettingsError
from .backend import DEFAULT_HOST, LiveBackend, ReplayBackend
from .compositor import LoopScreen
from .conversation import BLOCKING, STREAM, Conversation, ReplyRecord
from .event_pump import FRAME_RATE, TEXT_EVERY, EventPump
from .loop_panel import KNOBS, LoopPanel, PanelView
from .prefs import Prefs, load_prefs, save_prefs
from .prompt import PromptArea
from .transcript import ReplyView, Transcript, legend_text

#: Below this terminal width the loop panel moves under the transcript (compact form).
NARROW_WIDTH = 100

#: knob -> (step, lowest, highest) for the raise/lower keys
KNOB_STEPS: dict[str, tuple[float, float, float]] = {
    "temperature": (0.1, 0.0, 5.0),
    "top_p": (0.05, 0.05, 1.0),
    "top_k": (5, *SamplingSettings.limits("top_k")),
    "min_p": (0.01, 0.0, 1.0),
}


#: the footer shows the raise / lower keys as one item
_KNOB_KEYS = Binding.Group("Adjust", compact=True)


class LoopChatApp(App[int]):
    CSS_PATH = "styles.tcss"
    TITLE = "loopchat"
    ENABLE_COMMAND_PALETTE = True

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
        Binding("ctrl+n", "new_conversation", "New"),
        Binding("f4", "toggle_markdown", "Markdown", show=False),
        # priority: the message box (a TextArea) binds F6/F7 to select line / select all
        Binding("f6", "toggle_boundaries", "Token boundaries", show=False, priority=True),
        Binding("f7", "toggle_colours", "Probability colours", show=False, priority=True),
        Binding("alt+left", "token_cursor(-1)", "Previous token", show=False),
        Binding("alt+right", "token_cursor(1)", "Next token", show=False),
        Binding("ctrl+y", "copy_reply", "Copy reply", show=False, priority=True),  # not TextArea redo
        # Ctrl+C stops a reply being generated (as in a terminal); otherwise Textual's
        # own hint ("press ctrl+q to quit"). priority: the prompt would take it as copy.
        Binding("ctrl+c", "interrupt", "Stop", show=False, priority=True),
    ]

    def __init__(
        self,
        backend: LiveBackend | ReplayBackend,
        *,
        prefs: Prefs | None = None,
        prefs_path: Path | None = None,
        owns_backend: bool = True,
        settings: SamplingSettings | None = None,
    ) -> None:
        super().__init__()
        self.backend = backend
        self.owns_backend = owns_backend
        self.prefs_path = prefs_path
        self.prefs = prefs or load_prefs(prefs_path)
        spec = getattr(backend, "spec", None)
        # the user's settings (what the next reply uses) ...
        self.live = LiveSettings(settings or (spec.sampling if spec else SamplingSettings()))
        # ... and the source the reply in flight reads: the same object, except for an F9
        # replay, which runs on the settings its original reply used
        self.run_live = self.live
        self.conversation = Conversation(system_prompt=spec.system_prompt if spec else None)
        self.pump = EventPump()
        self.current: ReplyRecord | None = None
        self.current_view: ReplyView | None = None
        self.pending_prompt: str | None = None
        self.selection: tuple[int, int] | None = None
        self.knob = "temperature"
        self.model_name = spec.name if spec else getattr(backend, "model_name", "")
        self.loading_since: float | None = None
        # for tests and benchmarks
        self.run_finished = asyncio.Event()
        self.model_ready = asyncio.Event()
        self.steps_seen = 0
        self.frames_rendered = 0
        self._text_due: list[Step] = []  # streamed tokens not yet in the transcript
        self.last_error: str | None = None
        self.change_made_after_steps: int | None = None
        self._panel_dirty = True
        self.narrow = False  # below NARROW_WIDTH columns: the panel goes under the transcript
        self.handle_signals = False  # run_tui: SIGTERM / SIGHUP quit like Ctrl+Q

    # ------------------------------------------------------------- layout ----
    def get_default_screen(self) -> Screen:
        return LoopScreen(id="_default")

    def compose(self) -> ComposeResult:
        yield Header(icon="⟳")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield Static(legend_text(), id="legend")
                yield Transcript(id="transcript")
            yield LoopPanel(id="panel")
        yield PromptArea(placeholder="Loading the model… (you can type already)", id="prompt")
        yield Footer(compact=True)

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def panel(self) -> LoopPanel:
        return self.query_one(LoopPanel)

    @property
    def prompt(self) -> PromptArea:
        return self.query_one("#prompt", PromptArea)

    @property
    def generating(self) -> bool:
        return self.current is not None and not self.current.done

    def on_mount(self) -> None:
        if self.handle_signals:
            self._exit_on_signals()
        self.backend.attach(self.pump.emit)
        self._apply_prefs_classes()
        self._update_subtitle()
        self.set_interval(1 / FRAME_RATE, self._frame, name="frame")
        self.prompt.focus()
        if isinstance(self.backend, ReplayBackend):
            self.prompt.placeholder = f"Replay of {self.backend.path.name} (no model loaded) — Ctrl+Q quits"
            self.prompt.disabled = True
            self.backend.play()
        elif self.backend.ready is not None:
            self._on_model_ready(self.backend.ready)
        elif self.backend.loading is None:
            self._load_model(None)
        self._refresh_panel()

    def on_resize(self, event: Any) -> None:
        # self.size is still the old size here: the event carries the new one
        self.narrow = event.size.width < NARROW_WIDTH
        self.screen.set_class(self.narrow, "-narrow")
        self._panel_dirty = True

    def _apply_prefs_classes(self) -> None:
        self.query_one("#legend").display = self.prefs.prob_colours

    def _update_subtitle(self) -> None:
        mode = "streaming" if self.prefs.streaming else "blocking"
        if isinstance(self.backend, ReplayBackend):
            self.sub_title = f"replay · {self.model_name}"
        elif self.backend.loading:
            self.sub_title = f"loading {self.backend.loading}… · {mode}"
        else:
            self.sub_title = f"{self.model_name or 'no model loaded'} · {mode}"

    # -------------------------------------------------------- model loading ----
    @work(thread=True, exclusive=True, group="load")
    def _load_model(self, name: str | None) -> None:
        """Resolve the model file (may download) off the UI thread, then load it on the worker."""
        self.backend.loading = name or self.backend.spec.name
        try:
            spec, path = self.backend.resolve(name)
        except Exception as exc:  # ConfigError / ModelFileError: one-line messages
            self.call_from_thread(self._report_error, str(exc), "load")
            return
        self.backend.load(spec, path)
        self.call_from_thread(self._update_subtitle)

    def switch_model(self, name: str) -> None:
        if isinstance(self.backend, ReplayBackend):
            self.notify("A replay has no model to switch", severity="warning")
            return
        if self.generating:
            self.notify("Stop the reply first (Esc), then switch the model", severity="warning")
            return
        self.model_ready.clear()
        self.prompt.placeholder = f"Loading {name}… (you can type already)"
        self.notify(f"Loading model {name}…", timeout=3)
        self.backend.loading = name
        self._update_subtitle()
        self._load_model(name)

    def _on_model_ready(self, ready: Any) -> None:
        self.model_name = ready.name
        spec = self.backend.spec
        if spec is not None and spec.name == ready.name:
            self.conversation.system_prompt = spec.system_prompt
        self.prompt.placeholder = f"Message {ready.name} — Enter sends, Ctrl+J new line"
        self._update_subtitle()
        self.model_ready.set()
        self._panel_dirty = True

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if isinstance(self.backend, LiveBackend):
            for name in self.backend.model_names:
                current = " (current)" if name == self.model_name else ""
                yield SystemCommand(
                    f"Switch model: {name}{current}",
                    self.backend.describe(name),
                    lambda n=name: self.switch_model(n),
                )
        yield SystemCommand("Stream/blocking mode", "Toggle how replies are shown (F3)", self.action_toggle_streaming)
        yield SystemCommand("Markdown", "Render finished replies as Markdown (F4)", self.action_toggle_markdown)
        yield SystemCommand("Token boundaries", "Show where each token starts (F6)", self.action_toggle_boundaries)
        yield SystemCommand("Probability colours", "Colour tokens by their probability (F7)", self.action_toggle_colours)
        yield SystemCommand("Replay last reply in the other mode", "Same seed and settings (F9)", self.action_replay_other_mode)
        yield SystemCommand("Regenerate last reply", "With the next seed (F5)", self.action_regenerate)
        yield SystemCommand("Copy last reply", "To the clipboard (Ctrl+Y)", self.action_copy_reply)
        yield SystemCommand("New conversation", "Forget the conversation (Ctrl+N)", self.action_new_conversation)
        yield SystemCommand("Sampling settings…", "Type values (F2)", self.action_settings)

    # ------------------------------------------------------------- frames ----
    def _frame(self) -> None:
        self.backend.flush()  # what the engine process sent since the last frame
        events = self.pump.drain()
        if not events:
            self._draw_text()  # tokens held back by the last frame (a slow model)
            if self.current_view is not None and self.current is not None and not self.current.done:
                self.current_view.tick()
            if self._panel_dirty:
                self._refresh_panel()
            return
        finished: list[tuple[ReplyRecord, ReplyView | None]] = []
        for ev in events:
            kind = getattr(ev, "kind", "")
            rec = self.current
            if kind == "step":
                if rec is not None:
                    rec.steps.append(ev)
                    self._text_due.append(ev)  # drawn every TEXT_EVERY-th frame
                    self.steps_seen += 1
            elif kind == "start":
                if rec is None or rec.done:  # a replayed trace: make the turn from the event
                    rec = self._replayed_turn(ev)
                rec.start = ev
            elif kind == "prefill":
                if rec is not None:
                    rec.prefill = ev
            elif kind == "context_trimmed":
                if rec is not None:
                    rec.trimmed = ev
                self.notify(
                    f"The conversation no longer fits the context ({ev.n_ctx} tokens): "
                    f"the {ev.dropped_messages} oldest message(s) were left out of this prompt.",
                    severity="warning",
                    timeout=8,
                )
            elif kind == "finish":
                if rec is not None and not rec.done:
                    self._draw_text()
                    rec.finish = ev
                    finished.append((rec, self.current_view))
            elif kind == "model_loading":
                self.loading_since = time.monotonic()
                self._update_subtitle()
            elif kind == "model_ready":
                self._on_model_ready(ev)
            elif kind == "worker_error":
                self._draw_text()
                self._report_error(ev.message, ev.during)
            elif kind == "run_done":
                if rec is not None and not rec.done:  # e.g. a replay stopped half-way
                    rec.error = "stopped"
                    finished.append((rec, self.current_view))
        if finished or self.frames_rendered % TEXT_EVERY == 0:
            self._draw_text()
        for rec, view in finished:
            self._finish_reply(rec, view)
        if self.selection is None:
            self._refresh_panel()
        self.frames_rendered += 1

    def _draw_text(self) -> None:
        """Append the streamed tokens not yet drawn to the live reply's view."""
        if self._text_due:
            if self.current_view is not None:
                self.current_view.add_steps(self._text_due)
            self._text_due = []

    def _replayed_turn(self, start: Start) -> ReplyRecord:
        users = [m for m in start.messages if m.role == "user"]
        if users:
            self.transcript.add_user(users[-1].content)
        rec = self.conversation.new_reply(STREAM, start.messages)
        rec.started_at = time.monotonic()
        self.current = rec
        self.current_view = self.transcript.add_reply(rec, self.prefs)
        self.run_finished.clear()
        return rec

    def _refresh_panel(self) -> None:
        self._panel_dirty = False
        rec, step, pinned = self.current, None, False
        if self.selection is not None:
            rec = self.conversation.reply(self.selection[0])
            if rec is not None:
                step = next((s for s in rec.steps if s.index == self.selection[1]), None)
                pinned = step is not None
        if rec is None and self.conversation.replies:
            rec = self.conversation.replies[-1]
        if rec is not None and step is None and rec.steps:
            step = rec.steps[-1]
        model = self.model_name or "none loaded"
        if isinstance(self.backend, LiveBackend) and self.backend.loading:
            model = f"{self.backend.loading} (loading…)"
        self.panel.show(
            PanelView(
                record=rec,
                step=step,
                live=(self.run_live if self.generating else self.live).get(),
                knob=self.knob,
                pinned=pinned,
                generating=self.generating,
                compact=self.narrow,
                model=model,
            )
        )

    # ------------------------------------------------------------- replies ----
    def on_prompt_area_submitted(self, event: PromptArea.Submitted) -> None:
        text = event.text.strip()
        if not text:
            return
        if isinstance(self.backend, ReplayBackend):
            self.notify("This is a replay of a recorded trace: no model is loaded", severity="warning")
            return
        if not self.model_ready.is_set():
            if isinstance(self.backend, LiveBackend) and self.backend.loading:
                self.notify("The model is still loading: your message stays in the box", severity="warning")
            else:
                self.notify(
                    "No model is loaded: pick one with Ctrl+P → switch model (your message stays in the box)",
                    severity="warning",
                )
            return
        if self.generating:
            self.notify("Still generating: press Esc to stop, then send", severity="warning")
            return
        self.selection = None
        self._clear_selection_views()
        self.pending_prompt = event.text
        self.prompt.value = ""
        self.transcript.add_user(text)
        mode = STREAM if self.prefs.streaming else BLOCKING
        self._start_reply(self.conversation.messages_for(text), mode, in_history=True)

    def _start_reply(
        self, messages: tuple[Message, ...], mode: str, run_live: LiveSettings | None = None, **kw: Any
    ) -> ReplyRecord:
        self._draw_text()  # the last reply's tokens go to its own view
        rec = self.conversation.new_reply(mode, messages, **kw)
        rec.started_at = time.monotonic()
        self.current = rec
        self.current_view = self.transcript.add_reply(rec, self.prefs)
        self.transcript.anchor()
        self.run_finished.clear()
        # Python's cycle collector would rescan every object the app holds (the whole
        # conversation, its steps, the widgets) while the reply streams: tens of ms a
        # time, taken from the loop. Until the reply ends it sees only new objects.
        gc.freeze()
        self.run_live = run_live or self.live
        rec.run_id = self.backend.generate(messages, self.run_live)
        self._panel_dirty = True
        return rec

    def _finish_reply(self, rec: ReplyRecord, view: ReplyView | None) -> None:
        f = rec.finish
        if rec.in_history and f is not None and f.reason != FinishReason.ERROR and f.text:
            user = rec.messages[-1]
            self.conversation.turns.extend([user, Message("assistant", f.text)])
            self.pending_prompt = None
        elif rec.in_history and f is not None and not f.text and f.reason == FinishReason.CANCELLED:
            # stopped before any text: the message is not part of the conversation
            if self.pending_prompt and not self.prompt.value:
                self.prompt.value = self.pending_prompt
                self.notify("Stopped before the first token: your message is back in the box", timeout=4)
            self.pending_prompt = None
        if f is not None and f.reason == FinishReason.ERROR:
            self._report_error(f.error or "the engine failed during the reply", "generate")
        elif view is not None:
            view.finish()
        if view is not None and (f is None or f.reason == FinishReason.ERROR):
            view.finish()
        if rec is self.current:
            self.current_view = None
        gc.unfreeze()  # older objects are collectable again (see _start_reply)
        self.run_finished.set()
        self._panel_dirty = True

    def _report_error(self, message: str, during: str) -> None:
        """The one error handler: notify, keep the app running, give the prompt back."""
        self.last_error = message
        title = "Model failed to load" if during == "load" else "Generation failed"
        self.notify(message, title=title, severity="error", timeout=12)
        if during == "load":
            if isinstance(self.backend, LiveBackend):
                self.backend.loading = None
            ready = getattr(self.backend, "ready", None)
            if ready is not None:  # the file was not found: the model loaded before is still there
                self.notify(f"Still using {ready.name}", timeout=4)
                self._on_model_ready(ready)
                return
            self.model_name = ""
            self.prompt.placeholder = "No model loaded — pick one with Ctrl+P → Switch model (you can type already)"
            self._update_subtitle()
            self._panel_dirty = True
            return
        rec = self.current
        if rec is not None and not rec.done and rec.start is None:
            # the prompt was never accepted: remove the turn, give the text back
            rec.error = message
            self.transcript.remove_last(2)
            self.conversation.replies.remove(rec)
            self.current, self.current_view = None, None
            self.run_finished.set()
        elif rec is not None and not rec.done:
            rec.error = message
            if self.current_view is not None:
                self.current_view.finish()
            self.run_finished.set()
        if self.pending_prompt and not self.prompt.value:
            self.prompt.value = self.pending_prompt
        self.pending_prompt = None

    # ------------------------------------------------------------- actions ----
    def action_stop(self) -> None:
        if self.generating:
            self.backend.cancel()
            self.notify("Stopping…", timeout=1.5)
        elif self.selection is not None:
            self.selection = None
            self._clear_selection_views()
            self._refresh_panel()
        elif isinstance(self.screen, Screen) and self.screen is not self.screen_stack[0]:
            self.pop_screen()

    def action_interrupt(self) -> None:
        focused = self.focused
        if self.generating:
            self.action_stop()
        elif isinstance(focused, PromptArea) and focused.selected_text:
            focused.action_copy()
        else:
            self.action_help_quit()

    def action_next_knob(self) -> None:
        self.knob = KNOBS[(KNOBS.index(self.knob) + 1) % len(KNOBS)]
        self.notify(f"Ctrl+↑/↓ now change {self.knob}", timeout=2)
        self._refresh_panel()

    def action_knob(self, direction: int) -> None:
        step, lo, hi = KNOB_STEPS[self.knob]
        source = self.run_live if self.generating else self.live
        value = getattr(source.get(), self.knob) + direction * step
        value = min(hi, max(lo, round(value, 2)))
        if self.knob == "top_k":
            value = int(value)
        self.set_setting(**{self.knob: value})
        self.change_made_after_steps = self.steps_emitted()
        self._refresh_panel()

    def steps_emitted(self) -> int:
        """Steps of the current reply the engine has emitted so far (drawn or queued)."""
        self.backend.flush()
        drawn = len(self.current.steps) if self.current is not None else 0
        return drawn + sum(1 for e in self.pump.snapshot() if getattr(e, "kind", "") == "step")

    def set_setting(self, **changes: Any) -> bool:
        """Change live settings (validated); used by keys, the dialog and tests."""
        try:
            self.live.update(**changes)
            if self.generating and self.run_live is not self.live:
                self.run_live.update(**changes)  # an F9 replay in flight takes the change too
        except SettingsError as exc:
            self.notify(str(exc), severity="error")
            return False
        self._panel_dirty = True
        return True

    def action_settings(self) -> None:
        from .settings_dialog import SettingsDialog

        def done(new: SamplingSettings | None) -> None:
            if new is not None:
                self.set_setting(**{n: getattr(new, n) for n in new.diff(self.live.get())})
                self._refresh_panel()

        self.push_screen(SettingsDialog(self.live.get(), generating=self.generating), done)

    def _save_prefs(self) -> None:
        error = save_prefs(self.prefs, self.prefs_path)
        if error:
            self.notify(error, severity="warning")

    def action_toggle_streaming(self) -> None:
        self.prefs.streaming = not self.prefs.streaming
        self._save_prefs()
        self._update_subtitle()
        mode = "streaming: tokens appear as they are drawn" if self.prefs.streaming else "blocking: the reply appears when complete"
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
        self._apply_prefs_classes()
        self._rebuild_all()

    def _last_done_reply(self) -> ReplyRecord | None:
        for rec in reversed(self.conversation.replies):
            if rec.done and rec.finish is not None:
                return rec
        return None

    def action_regenerate(self) -> None:
        if not self._can_run():
            return
        rec = self.conversation.last_in_history()
        if rec is None or not rec.done:
            self.notify("No reply to regenerate yet", severity="warning")
            return
        if rec.finish is not None and len(self.conversation.turns) >= 2 and rec.finish.reason != FinishReason.ERROR:
            del self.conversation.turns[-2:]
        rec.in_history = False
        pinned = self.live.get().seed
        if pinned is None:
            self.notify("Regenerating with a new random seed", timeout=2)
        else:  # the same seed would give the same reply: move the pinned seed on
            self.set_setting(seed=(pinned + 1) % (2**32))
            self.notify(f"Regenerating with seed {self.live.get().seed} (the next after {pinned})", timeout=3)
        mode = STREAM if self.prefs.streaming else BLOCKING
        new = self._start_reply(rec.messages, mode, in_history=True)
        rec.replaced_by = new.number
        for view in self.transcript.reply_views():
            if view.record is rec:
                view.changed()  # its title now says which reply replaced it

    def action_replay_other_mode(self) -> None:
        if not self._can_run():
            return
        rec = self._last_done_reply()
        if rec is None or rec.start is None:
            self.notify("No finished reply to replay yet", severity="warning")
            return
        other = STREAM if rec.mode == BLOCKING else BLOCKING
        # the same messages and the settings the reply started with (same seed, same
        # tokens); the user's own settings for the next replies stay as they are
        self._start_reply(
            rec.messages, other, run_live=LiveSettings(rec.start.settings),
            in_history=False, replay_of=rec.replay_of or rec.number,
        )

    def _can_run(self) -> bool:
        if isinstance(self.backend, ReplayBackend):
            self.notify("This is a replay of a recorded trace: no model is loaded", severity="warning")
            return False
        if self.generating:
            self.notify("Still generating: press Esc to stop first", severity="warning")
            return False
        if not self.model_ready.is_set():
            self.notify("The model is not loaded yet", severity="warning")
            return False
        return True

    def action_new_conversation(self) -> None:
        if self.generating:
            self.backend.cancel()
        self.current, self.current_view, self.selection = None, None, None
        spec = getattr(self.backend, "spec", None)
        self.conversation = Conversation(system_prompt=spec.system_prompt if spec else None)
        self.transcript.clear()
        self.run_finished.set()
        self._refresh_panel()
        self.notify("New conversation", timeout=1.5)

    def action_copy_reply(self) -> None:
        rec = self._last_done_reply()
        if rec is None:
            self.notify("No reply to copy yet", severity="warning")
            return
        self.copy_to_clipboard(rec.text)
        self.notify(f"Copied reply {rec.number} ({len(rec.text)} characters)", timeout=2)

    def action_help(self) -> None:
        from .help_screen import HelpScreen

        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
        else:
            self.push_screen(HelpScreen())

    # ------------------------------------------------------ token selection ----
    def _tokens(self) -> list[tuple[int, int]]:
        out = []
        for rec in self.conversation.replies:
            if rec.done:
                out.extend((rec.number, s.index) for s in rec.steps if s.text and not s.is_stop)
        return out

    def action_token_cursor(self, direction: int) -> None:
        tokens = self._tokens()
        if not tokens:
            self.notify("No finished reply yet: token cursor has nothing to select", timeout=2)
            return
        if self.selection is None or self.selection not in tokens:
            target: tuple[int, int] | None = tokens[-1] if direction < 0 else tokens[0]
        else:
            i = tokens.index(self.selection) + direction
            target = tokens[i] if 0 <= i < len(tokens) else None
        self.action_select_token(*target) if target else self.action_stop()

    def action_select_token(self, reply: int, step: int) -> None:
        self.selection = (reply, step)
        for view in self.transcript.reply_views():
            if view.record.number == reply:
                view.select(step)
                self.transcript.scroll_to_block(view)
            elif view.selected is not None:
                view.select(None)
        self._refresh_panel()

    def _clear_selection_views(self) -> None:
        for view in self.transcript.reply_views():
            if view.selected is not None:
                view.select(None)

    # ---------------------------------------------------------------- exit ----
    async def action_quit(self) -> None:
        self._stop_backend()
        self.exit(0)

    def _stop_backend(self) -> None:
        if self.generating:
            self.backend.cancel()
        if self.owns_backend:
            self.backend.close()
        else:
            self.backend.attach(None)

    def on_unmount(self) -> None:
        self._stop_backend()

    def _exit_on_signals(self) -> None:
        """SIGTERM and SIGHUP end the app the way Ctrl+Q does, so Textual gives the
        terminal back (main screen, mouse reporting off, cursor shown): Python's default
        for both is to die on the spot and leave the terminal in the app's modes."""
        import signal

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                loop.add_signal_handler(sig, self._exit_from_signal)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread / OS
                pass

    def _exit_from_signal(self) -> None:
        self._stop_backend()
        self.exit(0)


def create_app(
    *,
    config_path: str | None = None,
    model: str | None = None,
    replay: str | None = None,
    replay_speed: float = 1.0,
    verbose: bool = False,
    backend: LiveBackend | ReplayBackend | None = None,
    prefs: Prefs | None = None,
    prefs_path: Path | None = None,
    settings: SamplingSettings | None = None,
    host: str | None = None,
) -> LoopChatApp:
    """The app on a live model (or a trace with replay=FILE); raises ConfigError/TraceError.

    Pass `backend=` to share one loaded model between apps (it is then not closed on exit).
    """
    owns = backend is None
    if backend is None:
        if replay is not None:
            backend = ReplayBackend(replay, speed=replay_speed)
        else:
            backend = LiveBackend(config_path, model, verbose=verbose, host=host or DEFAULT_HOST)
    return LoopChatApp(backend, prefs=prefs, prefs_path=prefs_path, owns_backend=owns, settings=settings)


def run_tui(
    *,
    config_path: str | None,
    model: str | None,
    replay: str | None = None,
    replay_speed: float = 1.0,
    verbose: bool = False,
    host: str | None = None,
) -> int:
    """Run the app until the user quits; returns the exit code (2: could not start)."""
    try:
        app = create_app(
            config_path=config_path, model=model, replay=replay, replay_speed=replay_speed, verbose=verbose,
            host=host,
        )
    except Exception as exc:  # ConfigError, TraceError: one-line messages
        print(f"loopchat: {exc}", file=sys.stderr)
        return 2
    app.handle_signals = True
    result = app.run()
    return int(result or 0)
