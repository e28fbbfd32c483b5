"""A recorded trace played as if its model were running (`loopchat replay FILE`)."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

from loopchat.backends import Sink
from loopchat.events import Finish, RunDone, Start, WorkerError
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings


class ReplayBackend:
    """Plays a trace's events at their recorded pace × speed (speed <= 0 or inf: at once)."""

    can_generate = False
    live_settings = True  # as a local model's (a replay generates nothing: no reply waits for a change)
    can_step = False  # step mode needs the engine in this process
    step_refusal = "A replay plays recorded steps: step mode needs a model loaded in this process"
    can_branch = False
    branch_refusal = "A replay plays recorded steps: branching needs a model loaded in this process"
    control = None

    def vocabulary(self) -> None:
        return None

    def pending_probs(self, token_ids: object) -> None:
        return None

    loading = None
    ready = None
    system_prompt = None
    default_settings = SamplingSettings()

    def __init__(self, path: str | Path, speed: float = 1.0) -> None:
        from loopchat.trace import read_trace  # TraceError propagates: the caller reports it

        self.path = Path(path)
        self.header, self.events = read_trace(self.path)
        self.speed = speed
        self._sink: Sink | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.busy = False
        start = next((e.event for e in self.events if isinstance(e.event, Start)), None)
        self.name = start.model_name if start else "trace"
        if start is not None:
            self.default_settings = start.settings
        self.model_names: list[str] = []

    def describe(self, name: str) -> str:
        return ""

    def placeholder(self) -> str | None:
        return f"Replay of {self.path.name} (no model loaded) — Ctrl+Q quits"

    def attach(self, sink: Sink | None) -> None:
        self._sink = sink

    def start(self) -> None:
        if self._thread is not None:
            return
        self.busy = True
        self._thread = threading.Thread(target=self._run, name="loopchat-replay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
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

    def load(self, name: str) -> None:
        if self._sink is not None:
            self._sink(WorkerError("a replay has no model to switch to", during="load"))

    def generate(self, request: ReplyRequest) -> int:
        raise RuntimeError("a replay cannot generate (can_generate is False)")

    def set_settings(self, settings: SamplingSettings) -> None:
        """A recorded reply keeps the settings it was recorded with."""

    def cancel(self) -> None:
        self._stop.set()

    def flush(self) -> None:
        """Events are handed over as they are due."""

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
