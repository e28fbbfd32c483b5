"""A local GGUF model: the engine in a worker thread, or in a child process.

`start()` and `load(name)` resolve the model file off the caller's thread (resolving may
download an `hf` model), then the worker loads it: ModelLoading, then ModelReady or
WorkerError(during="load"). A file that cannot be found leaves the model loaded before
in place (its ModelReady is sent again). One LiveBackend can outlive an app (tests share
one loaded model between apps).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loopchat.backends import Sink
from loopchat.constraint import Constraint
from loopchat.events import HostEvent, ModelReady, WorkerError
from loopchat.flash_attn_setting import FlashAttn
from loopchat.model_spec import BUILTIN_CONFIG, Config
from loopchat.request import ReplyRequest
from loopchat.settings import LiveSettings, SamplingSettings
from loopchat.step_control import StepControl
from loopchat.threads_setting import Threads

#: Where the engine runs beside the UI: "thread" (a worker thread of the app's process)
#: or "process" (a child process; `loopchat --host` chooses). The thread is the default:
#: benchmarks/tui_throughput.py measures both side by side, and on 2 cores the thread
#: was ahead or level in every run (docs/performance.md has the figures). The child
#: process isolates a crash inside llama.cpp: it ends that process, not the app, the
#: user's text is kept and the model can be reloaded.
DEFAULT_HOST = "thread"

#: The reader thread of the engine process's events waits this long (s) after each read:
#: the app's frames read the pipe themselves (`flush`), so the thread only keeps the pipe
#: from filling while the UI is busy elsewhere (the pipe holds more steps than arrive in
#: this time: docs/performance.md, "Figures behind the code's choices").
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
    can_generate = True
    live_settings = True  # the loop reads the settings at every step

    def __init__(
        self,
        config: Config | None = None,
        model: str | None = None,
        *,
        verbose: bool = False,
        threads: Threads | None = None,
        host: str = DEFAULT_HOST,
        flash_attn: FlashAttn | None = None,
        draft_model: str | None = None,
    ) -> None:
        """`config`: models.toml as the caller parsed it (config.load_config; None: the
        built-in models); `model`: its entry's name or a GGUF file's path (None: the
        default). An unknown name raises ConfigError: the caller reports it."""
        from loopchat.engine.worker import EngineWorker

        self.config = config if config is not None else BUILTIN_CONFIG
        self.spec = self.config.get(model)
        self.verbose = verbose
        self.threads = threads  # overrides the model's `threads` (--threads, tests, benchmarks)
        self.flash_attn = flash_attn  # overrides the model's `flash_attn` (--flash-attn)
        self.draft_model = draft_model  # overrides the model's `draft` (--draft-model)
        self.ready: ModelReady | None = None  # the model loaded now
        self.loading: str | None = None
        self._relay = _Relay()
        self._live = LiveSettings(self.spec.sampling)  # what the reply in flight reads
        self.host = host
        self.control: StepControl | None = None  # the reply in flight's (step mode)
        if host == "process":
            from loopchat.engine.process_worker import ProcessEngineWorker

            self.worker: Any = ProcessEngineWorker(self._emit, read_period=READ_PERIOD)
        elif host == "thread":
            self.worker = EngineWorker(self._emit)
        else:
            raise ValueError(f"host must be 'thread' or 'process', not {host!r}")

    # ---- what the chat shows ------------------------------------------------------
    @property
    def name(self) -> str:
        return self.ready.name if self.ready is not None else ""

    @property
    def system_prompt(self) -> str | None:
        return self.spec.system_prompt

    def model_constraint(self) -> Constraint | None:
        """models.toml's grammar or JSON schema for this model (ConstraintError: unreadable)."""
        return self.spec.constraint()

    @property
    def default_settings(self) -> SamplingSettings:
        return self.spec.sampling

    @property
    def model_names(self) -> list[str]:
        return list(self.config.models)

    def describe(self, name: str) -> str:
        return self.config.models[name].description or self.config.models[name].source

    def placeholder(self) -> str | None:
        return None

    # ---- events ---------------------------------------------------------------------
    def _emit(self, event: HostEvent) -> None:
        if isinstance(event, ModelReady):
            self.ready, self.loading = event, None
        elif isinstance(event, WorkerError) and event.during == "load":
            self.loading = None
        self._relay.emit(event)

    def attach(self, sink: Sink | None) -> None:
        self._relay.attach(sink)

    def flush(self) -> None:
        """Hand over the events that have arrived from the engine, now."""
        self.worker.flush()

    # ---- loading --------------------------------------------------------------------
    def start(self) -> None:
        if self.ready is None and self.loading is None:
            self.load(self.spec.name)

    def load(self, name: str) -> None:
        self.loading = name
        threading.Thread(target=self._resolve_and_load, args=(name,), name="loopchat-resolve", daemon=True).start()

    def _resolve_and_load(self, name: str) -> None:
        try:
            spec, path = self.resolve(name)
        except Exception as exc:  # ConfigError / ModelFileError: one-line messages
            self.loading = None
            old = self.ready
            still = f"; still using {old.name}" if old is not None else ""
            self._emit(WorkerError(f"{exc}{still}", during="load"))
            if old is not None:  # nothing was unloaded: the chat goes on with it
                self._emit(old)
            return
        self.load_file(spec, path)

    def resolve(self, name: str | None = None) -> tuple[Any, Path]:
        """(spec, GGUF path) — may download (call it off the UI thread)."""
        spec = self.config.get(name or self.spec.name)
        return spec, spec.resolve_file(progress=False)

    def load_file(self, spec: Any, path: Path) -> None:
        """Load a resolved model file on the worker (the model loaded before is closed)."""
        from loopchat.engine.options import EngineOptions

        factory = EngineOptions.from_spec(
            spec,
            path,
            verbose=self.verbose,
            threads=self.threads,
            flash_attn=self.flash_attn,
            draft_model=self.draft_model or self.config.draft_path(spec),
        )
        self.spec = spec
        self.ready = None
        self.loading = spec.name
        self.worker.load(factory, spec.name, path)

    # ---- replies ----------------------------------------------------------------------
    def generate(self, request: ReplyRequest) -> int:
        self._live.set(request.settings)
        if not self.can_step:
            return self.worker.generate(request, live=self._live)
        self.control = StepControl(paused=request.step_paused)
        return self.worker.generate(request, live=self._live, control=self.control)

    def set_settings(self, settings: SamplingSettings) -> None:
        self._live.set(settings)
        control = self.control
        if control is not None:
            control.wake()  # a loop stopped before a draw reshapes its die now

    can_branch = True  # both hosts: the engine takes the tokens with the request
    branch_refusal = ""

    # ---- step mode (the thread host: the engine's StepControl is shared in memory) ------
    @property
    def can_step(self) -> bool:
        return self.host == "thread"

    @property
    def step_refusal(self) -> str:
        if self.can_step:
            return ""
        return "Step mode needs the model in this process (loopchat --host thread)"

    def _engine(self) -> Any:
        return getattr(self.worker, "_engine", None) if self.can_step else None

    def vocabulary(self) -> list[str] | None:
        engine = self._engine()
        return engine.vocabulary() if engine is not None else None

    def tokenizer(self) -> Any:
        """The model's tokenizer (the engine: its `first_token(text)` and `piece_text(id)`,
        for a logit bias typed as text), or None where the engine is not in this process."""
        return self._engine()

    def pending_probs(self, token_ids: Sequence[int]) -> list[tuple[float, float]] | None:
        engine = self._engine()
        return engine.pending_probs(token_ids) if engine is not None else None

    def cancel(self) -> None:
        self.worker.cancel()

    @property
    def busy(self) -> bool:
        return self.worker.busy

    def close(self) -> None:
        self.attach(None)
        self.worker.close()
