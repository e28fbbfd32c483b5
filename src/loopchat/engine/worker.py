"""One thread that owns the Engine from load to close and runs every call on it.

Commands go in through a queue (`Load`, `Generate`, `Close`: host_commands.py; a reply's
`Generate` carries its ReplyRequest whole); `cancel` sets a flag the loop reads without
touching the engine. Everything that comes out is handed to one
`emit` callback, called on the worker thread: the generation events of `events.py`
plus the worker's own notices below. `emit` must be cheap (append to a deque, post a
message): the loop waits for it. The TUI batches what arrived at frame rate.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loopchat.engine.engine import Engine
from loopchat.engine.host_commands import Call, Close, Generate, Load, WorkerCommand
from loopchat.errors import ContextOverflowError, EngineError
from loopchat.events import ModelLoading, ModelReady, RunDone, WorkerError
from loopchat.request import ReplyRequest
from loopchat.settings import LiveSettings
from loopchat.step_control import StepControl

EngineFactory = Callable[[], Engine]


def _internal_error(exc: BaseException, during: str) -> WorkerError:
    """A WorkerError for an exception nobody expected (a bug in loopchat or llama-cpp-python)."""
    detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return WorkerError(
        f"internal error while {'loading the model' if during == 'load' else 'generating'}: {detail}; "
        "this is a bug: please report it with the command you ran (the llama log may help)",
        during=during,
        internal=True,
    )


class EngineWorker:
    def __init__(self, emit: Callable[[Any], None], *, name: str = "loopchat-engine") -> None:
        self._emit = emit
        self._commands: queue.Queue[WorkerCommand] = queue.Queue()
        self._engine: Engine | None = None
        self._run_id = 0
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    # ---------------------------------------------------------- any thread ----
    def load(self, factory: EngineFactory, name: str, path: str | Path) -> None:
        """Close the current engine (if any) and load another, on the worker thread."""
        self._commands.put(Load(factory, name, str(path)))

    def generate(
        self, request: ReplyRequest, *, live: LiveSettings | None = None, control: StepControl | None = None
    ) -> int:
        """Run `request` after the commands before it; returns its run id (its RunDone's).
        `live`: the settings source read at every pass (None: request.settings);
        `control`: step mode (None: the loop runs freely)."""
        self._run_id += 1
        self._busy.set()
        self._commands.put(Generate(self._run_id, request, live, control))
        return self._run_id

    def call(self, fn: Callable[[Engine | None], None]) -> None:
        """Run `fn(engine)` on the worker thread after the commands before it (a shared run's serve)."""
        self._commands.put(Call(fn))

    def cancel(self) -> None:
        engine = self._engine
        if engine is not None:
            engine.cancel()

    @property
    def busy(self) -> bool:
        return self._busy.is_set()

    def flush(self) -> None:
        """Every event is already handed over as it happens (ProcessEngineWorker may hold
        some back for a moment)."""

    def close(self, timeout: float | None = 10.0) -> None:
        self.cancel()
        self._commands.put(Close())
        self._thread.join(timeout)

    # ------------------------------------------------------- worker thread ----
    def _main(self) -> None:
        while True:
            command = self._commands.get()
            try:
                match command:
                    case Close():
                        self._close_engine()
                        return
                    case Load(factory, name, path):
                        self._load(factory, name, path)
                    case Generate():
                        self._generate(command)
                    case Call(fn):
                        fn(self._engine)
            except Exception as exc:  # last resort: never kill the thread silently
                self._emit(_internal_error(exc, "load" if isinstance(command, Load) else "generate"))

    def _close_engine(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    def _load(self, factory: EngineFactory, name: str, path: str) -> None:
        import time

        self._close_engine()
        self._emit(ModelLoading(name=name, path=path))
        t0 = time.perf_counter()
        try:
            engine = factory()
        except EngineError as exc:
            self._emit(WorkerError(str(exc), during="load"))
            return
        self._engine = engine
        self._emit(
            ModelReady(
                name=engine.name,
                path=str(engine.model_path),
                n_ctx=engine.n_ctx,
                n_vocab=engine.n_vocab,
                threads=engine.threads,
                load_ms=(time.perf_counter() - t0) * 1000.0,
                template_note=engine.template_note,
                mode=engine.opening_mode,
                threads_reason=engine.threads_reason,
            )
        )

    def _generate(self, command: Generate) -> None:
        # Whatever happens, a run's WorkerError (if any) is emitted before its RunDone:
        # consumers (`loopchat run`, the app) stop reading the run at RunDone.
        try:
            if self._engine is None:
                self._emit(
                    WorkerError("no model is loaded: pick one with --model or the model list", during="generate")
                )
                return
            try:
                for event in self._engine.run_reply(command.request, live=command.live, control=command.control):
                    self._emit(event)
            except EngineError as exc:
                self._emit(WorkerError(str(exc), "generate", context_overflow=isinstance(exc, ContextOverflowError)))
            except Exception as exc:  # a bug: report it as this run's error, then RunDone
                self._emit(_internal_error(exc, "generate"))
        finally:
            if self._commands.empty():
                self._busy.clear()
            self._emit(RunDone(command.run_id))
