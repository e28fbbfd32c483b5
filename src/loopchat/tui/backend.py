"""Where the app's events come from: a live EngineWorker, or a recorded trace.

Both hand every event to one `sink` callable (the app's EventPump.emit) on their own
thread. A LiveBackend can outlive an app (tests share one loaded model between apps).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from ..events import Finish, Message, Start
from ..settings import LiveSettings, SamplingSettings

Sink = Callable[[Any], None]

#: Where the engine runs beside the UI: "thread" (a worker thread of the app's process)
#: or "process" (a child process; `loopchat --host` chooses). benchmarks/tui_throughput.py
#: measures both side by side on 2 cores. Over five runs (each app process against the
#: headless one of its round, median of 5 rounds): the thread host 0.92-1.09, the child
#: process 0.83-0.98 (level with the thread in two runs, behind in three); key-press
#: latency p99 5-7 ms with the thread, 7-10 ms with the child process. The thread is the
#: default; the child process isolates a crash inside llama.cpp (seen: ggml's AMX kernels
#: segfault on some CPUs, which the Makefile's build leaves out): it ends that process,
#: not the app, the user's text is kept and the model can be reloaded.
DEFAULT_HOST = "thread"

#: The reader thread of the engine process's events waits this long (s) after each read:
#: the app's frames read the pipe themselves (`flush`), so the thread only keeps the pipe
#: from filling while the UI is busy elsewhere (the pipe holds ~1 s of steps).
READ_PERIOD = 0.25


class _Relay:
    """Forwards events to the current sink; keeps them until one is attached."""

    def __init__(self) -> None:
        self._sink: Sink | None = None
        self._backlog: deque[Any] = deque()
        self._lock = threading.Lock()

    def emit(self, event: Any) -> None:
        sink = self._sink
        if sink is not None:
            sink(event)
            return
        with self._lock:
            if self._sink is None:
                self._backlog.append(event)
                return
        self._sink(event)

    def attach(self, sink: Sink | None) -> None:
        with self._lock:
            self._sink = sink
            if sink is not None:
                while self._backlog:
                    sink(self._backlog.popleft())


class LiveBackend:
    kind = "live"

    def __init__(
        self,
        config_path: str | None = None,
        model: str | None = None,
        *,
        verbose: bool = False,
        threads: int | None = None,
        host: str = DEFAULT_HOST,
    ) -> None:
        from ..config import load_config  # ConfigError propagates: the caller reports it
        from ..worker import EngineWorker, ModelReady

        self._ModelReady = ModelReady
        self.config = load_config(config_path)
        self.spec = self.config.get(model)
        self.verbose = verbose
        self.threads = threads  # overrides the model's `threads` (tests, benchmarks)
        self.ready: Any = None  # the last ModelReady
        self.loading: str | None = None
        self._relay = _Relay()
        self.host = host
        if host == "process":
            from ..process_worker import ProcessEngineWorker

            self.worker: Any = ProcessEngineWorker(self._emit, read_period=READ_PERIOD)
        elif host == "thread":
            self.worker = EngineWorker(self._emit)
        else:
            raise ValueError(f"host must be 'thread' or 'process', not {host!r}")

    def _emit(self, event: Any) -> None:
        kind = getattr(event, "kind", "")
        if kind == "model_ready":
            self.ready, self.loading = event, None
        elif kind == "worker_error" and event.during == "load":
            self.loading = None
        self._relay.emit(event)

    def attach(self, sink: Sink | None) -> None:
        self._relay.attach(sink)

    @property
    def model_names(self) -> list[str]:
        return list(self.config.models)

    def describe(self, name: str) -> str:
        return self.config.models[name].description or self.config.models[name].source

    def resolve(self, name: str | None = None) -> tuple[Any, Path]:
        """(spec, GGUF path) — may download (call it off the UI thread)."""
        spec = self.config.get(name or self.spec.name)
        return spec, spec.resolve_file(progress=False)

    def load(self, spec: Any, path: Path) -> None:
        from ..engine import EngineOptions
        from ..paths import llama_log_path

        factory = EngineOptions(
            str(path),
            name=spec.name,
            n_ctx=spec.n_ctx,
            threads=self.threads or spec.threads,
            chat_template=spec.chat_template,
            log_path=str(llama_log_path()),
            verbose=self.verbose,
        )

        self.spec = spec
        self.ready = None
        self.loading = spec.name
        self.worker.load(factory, spec.name, path)

    def generate(self, messages: tuple[Message, ...], settings: LiveSettings | SamplingSettings) -> int:
        return self.worker.generate(messages, settings)

    def cancel(self) -> None:
        self.worker.cancel()

    def flush(self) -> None:
        """Hand over the events that have arrived from the engine, now."""
        self.worker.flush()

    @property
    def busy(self) -> bool:
        return self.worker.busy

    def close(self) -> None:
        self.attach(None)
        self.worker.close()


class ReplayBackend:
    """Plays a trace's events at their recorded pace × speed (speed <= 0 or inf: at once)."""

    kind = "replay"

    def __init__(self, path: str | Path, speed: float = 1.0) -> None:
        from ..trace import read_trace  # TraceError propagates: the caller reports it

        self.path = Path(path)
        self.header, self.events = read_trace(self.path)
        self.speed = speed
        self.ready = None
        self.loading = None
        self.spec = None
        self._sink: Sink | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.busy = False
        start = next((e.event for e in self.events if isinstance(e.event, Start)), None)
        self.model_name = start.model_name if start else "trace"
        self.model_names: list[str] = []

    def attach(self, sink: Sink | None) -> None:
        self._sink = sink

    def play(self) -> None:
        if self._thread is not None:
            return
        self.busy = True
        self._thread = threading.Thread(target=self._run, name="loopchat-replay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from ..worker import RunDone

        sink = self._sink or (lambda e: None)
        instant = self.speed <= 0 or math.isinf(self.speed)
        t0 = time.perf_counter()
        first = self.events[0].t_ms if self.events else 0.0
        run = 0
        for traced in self.events:
            if self._stop.is_set():
                break
            if not instant:
                due = t0 + (traced.t_ms - first) / 1000.0 / self.speed
                delay = due - time.perf_counter()
                if delay > 0 and self._stop.wait(delay):
                    break
            sink(traced.event)
            if isinstance(traced.event, Finish):
                run += 1
                sink(RunDone(run))
        self.busy = False

    def cancel(self) -> None:
        self._stop.set()

    def flush(self) -> None:
        """Events are handed over as they are due."""

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
