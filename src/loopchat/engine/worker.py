"""One thread that owns the Engine from load to close and runs every call on it.

Commands go in through a queue (`load`, `generate`, `close`); `cancel` sets a flag the
loop reads without touching the engine. Everything that comes out is handed to one
`emit` callback, called on the worker thread: the generation events of `events.py`
plus the worker's own notices below. `emit` must be cheap (append to a deque, post a
message): the loop waits for it. The TUI batches what arrived at frame rate.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from loopchat.engine.engine import ContextOverflowError, Engine, EngineError
from loopchat.events import Message, ModelLoading, ModelReady, RunDone, WorkerError
from loopchat.settings import LiveSettings, SamplingSettings
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
        self._commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._engine: Engine | None = None
        self._run_id = 0
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    # ---------------------------------------------------------- any thread ----
    def load(self, factory: EngineFactory, name: str, path: str | Path) -> None:
        """Close the current engine (if any) and load another, on the worker thread."""
        self._commands.put(("load", (factory, name, str(path))))

    def generate(
        self,
        messages: Sequence[Message],
        settings: LiveSettings | SamplingSettings,
        *,
        report_k: int = 10,
        reuse_at_most: int | None = None,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
        control: StepControl | None = None,
        reply_prefix: Sequence[int] = (),
        first_token: int | None = None,
    ) -> int:
        self._run_id += 1
        self._busy.set()
        self._commands.put(
            (
                "generate",
                (
                    self._run_id,
                    tuple(messages),
                    settings,
                    report_k,
                    reuse_at_most,
                    tuple(stop),
                    ignore_eos,
                    control,
                    tuple(reply_prefix),
                    first_token,
                ),
            )
        )
        return self._run_id

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
        self._commands.put(("close", None))
        self._thread.join(timeout)

    # ------------------------------------------------------- worker thread ----
    def _main(self) -> None:
        while True:
            command, args = self._commands.get()
            if command == "close":
                self._close_engine()
                return
            try:
                if command == "load":
                    self._load(*args)
                elif command == "generate":
                    self._generate(*args)
            except Exception as exc:  # last resort: never kill the thread silently
                self._emit(_internal_error(exc, command))

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

    def _generate(
        self,
        run_id: int,
        messages: tuple[Message, ...],
        settings: Any,
        report_k: int,
        reuse_at_most: int | None,
        stop: tuple[str, ...] = (),
        ignore_eos: bool = False,
        control: StepControl | None = None,
        reply_prefix: tuple[int, ...] = (),
        first_token: int | None = None,
    ) -> None:
        # Whatever happens, a run's WorkerError (if any) is emitted before its RunDone:
        # consumers (`loopchat run`, the app) stop reading the run at RunDone.
        try:
            if self._engine is None:
                self._emit(
                    WorkerError("no model is loaded: pick one with --model or the model list", during="generate")
                )
                return
            try:
                for event in self._engine.generate(
                    messages,
                    settings,
                    report_k=report_k,
                    reuse_at_most=reuse_at_most,
                    stop=stop,
                    ignore_eos=ignore_eos,
                    control=control,
                    reply_prefix=reply_prefix,
                    first_token=first_token,
                ):
                    self._emit(event)
            except EngineError as exc:
                self._emit(WorkerError(str(exc), "generate", context_overflow=isinstance(exc, ContextOverflowError)))
            except Exception as exc:  # a bug: report it as this run's error, then RunDone
                self._emit(_internal_error(exc, "generate"))
        finally:
            if self._commands.empty():
                self._busy.clear()
            self._emit(RunDone(run_id))
