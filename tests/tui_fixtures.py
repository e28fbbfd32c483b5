"""Helpers for the TUI tests: waiting on the app, a shared live model, a fake backend."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loopchat.events import Candidate, Finish, FinishReason, Message, Prefill, Start, Step
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings

DATA = Path(__file__).parent / "data"
REPLY_TRACE = DATA / "reply.jsonl"


async def wait_for(pilot: Any, predicate: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Let the app run until predicate() is true (no fixed sleeps), or fail after timeout."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what or predicate}")
        await pilot.pause(0.02)


async def document_settled(pilot: Any, timeout: float = 15.0) -> None:
    """After Ctrl+T: the document view, if shown, laid out at its width. It is laid out in
    the layout after the key, which the Pilot's pause need not await (it ends when the process
    looks idle)."""
    await pilot.pause()
    doc = pilot.app.document
    await wait_for(pilot, lambda: not doc.display or doc.ready, timeout, "the document laid out")


async def wait_run(pilot: Any, timeout: float = 60.0) -> None:
    app = pilot.app
    await asyncio.wait_for(app.run_finished.wait(), timeout)
    await pilot.pause()


def fake_app(tmp_path: Path, backend: Any = None, **prefs: Any) -> Any:
    """The chat app on a FakeBackend (or `backend`), its prefs in tmp_path; Markdown off
    unless said."""
    from loopchat.chat.prefs import Prefs
    from loopchat.tui.app import LoopChatApp

    prefs.setdefault("markdown", False)
    return LoopChatApp(backend or FakeBackend(), prefs=Prefs(**prefs), prefs_path=tmp_path / "p.json")


def model_app(backend: Any, tmp_path: Path, **settings: Any) -> Any:
    """The chat app on a real backend (the model loaded by a fixture): Markdown off, no
    history, its prefs in tmp_path, the sampling settings `settings`."""
    from loopchat.chat.prefs import Prefs
    from loopchat.settings import SamplingSettings
    from loopchat.tui.launch import create_app

    return create_app(
        backend=backend,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "p.json",
        settings=SamplingSettings(**settings),
        history=False,
    )


async def palette_pick(pilot: Any, text: str) -> None:
    """Open the command palette (Ctrl+P), type `text`, wait until its first entry is
    the one asked for (the palette searches in the background), and press Enter."""
    from textual.command import CommandList, CommandPalette

    app = pilot.app
    await pilot.press("ctrl+p")
    await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), 10, "the command palette")
    await pilot.press(*text)

    def found() -> bool:
        lists = app.screen.query(CommandList)
        if not lists or lists.first().option_count == 0:
            return False
        first = lists.first().get_option_at_index(0).prompt
        return text.lower() in str(getattr(first, "plain", first)).lower()

    await wait_for(pilot, found, 10, f"the palette's entry {text!r}")
    await pilot.press("enter")


def record_notices(app: Any) -> list[str]:
    """The messages the app notifies from now on, in order (through the app's public
    notice_listeners, not Textual's private list)."""
    seen: list[str] = []
    app.notice_listeners.append(lambda notice: seen.append(notice.message))
    return seen


async def reply_to(pilot: Any, text: str) -> None:
    """Type `text` into the prompt, send it, and wait until the reply has finished."""
    await pilot.press(*text, "enter")
    await wait_run(pilot)


def drawn(view: Any) -> str:
    """What a transcript block has drawn, its lines joined (what the screen shows)."""
    return "\n".join(view.line(i).text for i in range(view.height))


class StepGate:
    """Holds the engine still mid-reply: after `after` more steps have been handed to the
    app, the backend's thread waits (inside its emit) until `release()`. A test can then
    look at a reply while it is certainly still being generated, on any machine."""

    def __init__(self, app: Any, after: int) -> None:
        self.after = after
        self.seen = 0
        self._open = threading.Event()
        sink = app.pump.emit

        def emit(event: Any) -> None:
            sink(event)
            if isinstance(event, Step):
                self.seen += 1
                if self.seen == self.after:
                    self._open.wait(60)

        app.backend.attach(emit)

    @property
    def holding(self) -> bool:
        return self.seen >= self.after and not self._open.is_set()

    def release(self) -> None:
        self._open.set()


class FakeBackend:
    """Emits synthetic events from a thread (no model): for fast UI-only checks.
    A `Backend` (loopchat.backends) like the real ones."""

    can_generate = True
    live_settings = True
    can_step = False
    step_refusal = "The fake backend has no step mode"
    can_branch = False
    branch_refusal = "The fake backend cannot branch"
    control = None
    name = "fake-model"
    loading = None
    system_prompt = None
    default_settings = SamplingSettings()

    def __init__(self, tokens: list[str] | None = None, delay: float = 0.01, fail: str | None = None) -> None:
        self.tokens = tokens or ["Hello", ",", " world", "!", " How", " are", " you", "?"]
        self.delay = delay
        self.fail = fail
        self.sink: Any = None
        self.ready = type("Ready", (), {"name": "fake-model"})()
        self.model_names: list[str] = []
        self._cancel = threading.Event()
        self._settings: Any = None
        self.busy = False
        self.runs = 0

    def describe(self, name: str) -> str:
        return ""

    def vocabulary(self) -> None:
        return None

    def pending_probs(self, token_ids: Any) -> None:
        return None

    def placeholder(self) -> str | None:
        return None

    def start(self) -> None:
        pass

    def load(self, name: str) -> None:
        raise AssertionError("FakeBackend has no models to load")

    def set_settings(self, settings: SamplingSettings) -> None:
        self._settings = settings

    def attach(self, sink: Any) -> None:
        self.sink = sink

    def generate(self, request: ReplyRequest) -> int:
        self.runs += 1
        self._cancel.clear()
        self._settings = request.settings
        threading.Thread(target=self._run, args=(request.messages, lambda: self._settings), daemon=True).start()
        return self.runs

    def _run(self, messages: tuple[Message, ...], source: Any) -> None:
        from loopchat.events import RunDone, WorkerError

        emit = self.sink
        run = self.runs
        if self.fail:
            emit(WorkerError(self.fail, during="generate"))
            emit(RunDone(run))
            return
        settings = source() if callable(source) else source
        emit(Start("fake-model", "/fake.gguf", 1, 2048, 100, 2, messages, "prompt", (1, 2, 3), settings, 10))
        emit(Prefill(3, 0, 3, 1, 5.0))
        prev = None
        text = ""
        n = 0
        reason = FinishReason.STOP
        for i, tok in enumerate(self.tokens + ["<|im_end|>"]):
            if self._cancel.is_set():
                reason = FinishReason.CANCELLED
                break
            time.sleep(self.delay)
            now = source() if callable(source) else source
            stop = tok == "<|im_end|>"
            cands = tuple(Candidate(j, t, p) for j, t, p in [(i, tok, 0.6), (99, " the", 0.3), (98, " a", 0.1)])
            emit(
                Step(
                    i,
                    i,
                    tok,
                    "" if stop else tok,
                    stop,
                    cands,
                    cands[:2],
                    0.6,
                    1,
                    0.66,
                    1,
                    1.2,
                    0.8,
                    2,
                    5.0 if i == 0 else 8.0 + i % 3,
                    1 if i else 3,
                    0.3,
                    now,
                    now.diff(prev),
                    3 + i + (0 if stop else 1),
                )
            )
            prev = now
            if not stop:
                text += tok
                n += 1
        emit(Finish(reason, 3, n, n + 1, 5.0, 6.0, 50.0, 60.0, 100.0, text, 3 + n, 2048))
        emit(RunDone(run))

    def flush(self) -> None:
        pass

    def cancel(self) -> None:
        self._cancel.set()

    def close(self) -> None:
        self._cancel.set()


# --------------------------------------------------------------------------------------
TRACE_PROMPT = "Name three colours of the rainbow."
TRACE_SETTINGS = SamplingSettings(temperature=0.7, seed=7, max_tokens=40)


def record_trace(path: Path = REPLY_TRACE) -> Path:
    """Record one real reply of the default model (the snapshot tests replay it).

    Run: python tests/tui_fixtures.py record
    """
    from loopchat.config import load_config
    from loopchat.engine.engine import Engine
    from loopchat.trace import TraceWriter

    spec = load_config(None).get(None)
    messages = []
    if spec.system_prompt:
        messages.append(Message("system", spec.system_prompt))
    messages.append(Message("user", TRACE_PROMPT))
    with Engine(spec.resolve_file(), name=spec.name, n_ctx=spec.n_ctx, threads=1) as engine:
        list(engine.generate(messages, TRACE_SETTINGS))  # warm-up: steady timings
        engine.reset()
        with TraceWriter(path, extra={"recorded_for": "loopchat TUI snapshot tests"}) as writer:
            for event in engine.generate(messages, TRACE_SETTINGS):
                writer.write(event)
    return path


COMPARE_TRACE = DATA / "compare.jsonl"
COMPARE_QUESTIONS = ("What is 482 * 194?", "What is 482 * 194? Let's calculate step by step.")


def record_compare_trace(path: Path = COMPARE_TRACE) -> Path:
    """Record docs/compare-walkthrough.md's conversation: the default model's two replies in one
    conversation (the second question sees the first exchange, as in the chat), with its
    own sampling settings at temperature 0 (greedy: the same tokens on every machine
    that computes the same logits). The compare tests replay it.

    Run: python tests/tui_fixtures.py record-compare
    """
    import dataclasses

    from loopchat.config import load_config
    from loopchat.engine.engine import Engine
    from loopchat.events import Finish as _Finish
    from loopchat.trace import TraceWriter

    spec = load_config(None).get(None)
    settings = dataclasses.replace(spec.sampling, temperature=0.0, seed=1)
    messages = [Message("system", spec.system_prompt)] if spec.system_prompt else []
    with Engine(spec.resolve_file(), name=spec.name, n_ctx=spec.n_ctx, threads=1) as engine:
        list(engine.generate([*messages, Message("user", "Hi")], settings, report_k=5))  # warm-up
        engine.reset()
        with TraceWriter(path, extra={"recorded_for": "loopchat compare tests"}) as writer:
            for question in COMPARE_QUESTIONS:
                messages.append(Message("user", question))
                for event in engine.generate(messages, settings, report_k=5):
                    writer.write(event)
                    if isinstance(event, _Finish):
                        messages.append(Message("assistant", event.text))
    return path


def panel_text(app: Any, width: int | None = None) -> str:
    """The loop panel's current content as plain text."""
    from rich.console import Console

    from loopchat.tui.loop_panel import panel_renderable

    view = app.panel.view
    console = Console(width=width or max(40, view.width), record=True, color_system=None, file=open("/dev/null", "w"))
    console.print(panel_renderable(view))
    return console.export_text()


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["record"]:
        print(record_trace())
    elif sys.argv[1:] == ["record-compare"]:
        print(record_compare_trace())


def loaded_live_backend():
    """The default model in a LiveBackend, loaded (a generator for a module-scoped
    fixture: `yield from loaded_live_backend()`). One llama thread: the tests stay quick
    even when other processes load the 2 cores (two OpenMP threads on a busy 2-core
    machine slow the loop down a hundredfold)."""
    from loopchat.backends.live import LiveBackend

    b = LiveBackend(None, None, threads=1)
    b.start()
    deadline = time.monotonic() + 60
    while b.ready is None:
        assert time.monotonic() < deadline, "the default model did not load"
        time.sleep(0.05)
    try:
        yield b
    finally:
        b.close()
