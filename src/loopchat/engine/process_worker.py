"""The engine in a child process, behind the same interface as `worker.EngineWorker`.

Why a process: a crash inside llama.cpp (a segfault or an abort in native code) ends
the child, not the app: the reader thread reports it, the user's text stays and the
next load starts a new child. In one process the engine thread also shares the GIL with
the UI thread; here it has its own interpreter and only CPU time is shared. The price:
each Step is pickled and sent on the engine thread (the cost a step: docs/performance.md,
"Figures behind the code's choices", "The engine in a child process");
benchmarks/tui_throughput.py measures both hosts side by side, and `backends/live.py`
(DEFAULT_HOST) says which is the default and why.

Inside the child, an `EngineWorker` thread loads and owns the Engine exactly as in the
single-process set-up; the child's main thread relays commands, settings changes and
cancels from pipes. Events come back over a pipe, and a reader thread in the parent
hands each one to `emit`.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from loopchat.engine.host_commands import Cancel, ChangeSettings, ChildCommand, Close, Generate, Load
from loopchat.engine.options import EngineOptions
from loopchat.engine.worker import EngineWorker
from loopchat.events import RunDone, WorkerError
from loopchat.request import ReplyRequest
from loopchat.settings import LiveSettings, SamplingSettings
from loopchat.step_control import StepControl


def _child_main(commands: Connection, events: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C belongs to the parent
    send_lock = threading.Lock()

    def send(event: Any) -> None:
        # called on the engine thread for every event, each sent at once: batching them
        # hid from the UI which step a key press came before
        with send_lock:
            try:
                events.send(event)
            except (BrokenPipeError, OSError):
                pass

    worker = EngineWorker(send)
    live = LiveSettings()
    while True:
        try:
            command: ChildCommand = commands.recv()
        except (EOFError, OSError):
            command = Close()
        match command:
            case Load(factory, name, path):
                worker.load(factory, name, path)
            case Generate(request=request):
                live.set(request.settings)
                worker.generate(request, live=live)
            case ChangeSettings(settings):
                live.set(settings)
            case Cancel():
                worker.cancel()
            case Close():
                worker.close()
                return


class ProcessEngineWorker:
    """EngineWorker's interface; the engine runs in a spawned child process."""

    def __init__(self, emit: Callable[[Any], None], *, name: str = "loopchat-engine", read_period: float = 0.0) -> None:
        """`read_period` (s): after handing over what has arrived, the reader thread waits
        this long before it reads again (0: it wakes for every event). See `_read`."""
        self._emit = emit
        self._name = name
        self._read_period = read_period
        self._read_lock = threading.Lock()  # one reader of the pipe at a time, in order
        self._stop_reading = threading.Event()  # wakes the reader from its period at close
        self._lock = threading.Lock()
        self._run_id = 0
        self._busy = threading.Event()
        self._live: LiveSettings | None = None
        self._closing = False
        self._start()

    def _start(self) -> None:
        """Spawn the child process and the thread that reads its events."""
        ctx = multiprocessing.get_context("spawn")
        self._commands, child_commands = ctx.Pipe(duplex=False)[::-1]
        parent_events, child_events = ctx.Pipe(duplex=False)
        self._events = parent_events
        self._proc = ctx.Process(target=_child_main, args=(child_commands, child_events), name=self._name, daemon=True)
        self._proc.start()
        child_commands.close()
        child_events.close()
        self._child_runs = 0  # run ids as the child's EngineWorker counts them
        self._reader = threading.Thread(target=self._read, name=f"{self._name}-reader", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._proc.is_alive()

    def _send(self, command: ChildCommand) -> None:
        with self._lock:
            try:
                self._commands.send(command)
            except (BrokenPipeError, OSError):
                pass

    # ---------------------------------------------------------- any thread ----
    def load(self, factory: EngineOptions, name: str, path: Any) -> None:
        if not isinstance(factory, EngineOptions):
            raise TypeError("ProcessEngineWorker.load needs EngineOptions (picklable), not a callable")
        if not self._proc.is_alive() and not self._closing:
            self._start()  # the last engine process died: a load starts a new one
        self._send(Load(factory, name, str(path)))

    def generate(
        self, request: ReplyRequest, *, live: LiveSettings | None = None, control: StepControl | None = None
    ) -> int:
        """EngineWorker.generate's: `request` is pickled to the child; `live`'s changes are
        sent after it. `control` must be None: step mode needs the engine in this process."""
        if control is not None:
            raise ValueError("step mode needs the engine in the app's process (the thread host)")
        self._run_id += 1
        if not self._proc.is_alive():
            self._emit(
                WorkerError("the engine process is not running: load a model again (Ctrl+P → switch model)", "generate")
            )
            self._emit(RunDone(self._run_id))
            return self._run_id
        self._busy.set()
        self._unsubscribe()
        if live is not None:
            self._live = live
            live.subscribe(self._forward_settings)
            current = live.get()  # what the reply starts with, as the engine reads it in a thread host
            if current is not request.settings:
                request = request.with_(settings=current)
        self._send(Generate(self._run_id, request))
        return self._run_id

    def _forward_settings(self, settings: SamplingSettings) -> None:
        self._send(ChangeSettings(settings))

    def _unsubscribe(self) -> None:
        if self._live is not None:
            self._live.unsubscribe(self._forward_settings)
            self._live = None

    def cancel(self) -> None:
        self._send(Cancel())

    @property
    def busy(self) -> bool:
        return self._busy.is_set()

    def close(self, timeout: float | None = 10.0) -> None:
        self._closing = True
        self._unsubscribe()
        self.cancel()
        self._send(Close())
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(2)
        self._stop_reading.set()  # the child has gone: no need to read on to the end
        self._reader.join(2)

    # -------------------------------------------------------- reader thread ----
    def _read(self) -> None:
        """Hand the child's events to `emit`, in order.

        Woken for each event, this thread cost the UI process CPU for every token: mostly
        the wake-up itself, then unpickling. With a `read_period` it wakes at most once a
        period and takes everything that has arrived. The app reads the pipe in each of
        its frames (`flush()`, on a thread that is awake then anyway) and gives this
        thread a longer period (READ_PERIOD). The pipe holds more steps than arrive in a
        period, so the engine does not wait for it. The figures: docs/performance.md,
        "Figures behind the code's choices", "The engine in a child process"."""
        period = self._read_period
        while True:
            try:
                wait([self._events])
                with self._read_lock:
                    self._drain()
            except (EOFError, OSError):
                if not self._closing:
                    self._proc.join(1)
                    was_busy = self._busy.is_set()
                    self._busy.clear()
                    self._emit(
                        WorkerError(
                            f"the engine process stopped unexpectedly (exit code {self._proc.exitcode}); "
                            "load a model again (Ctrl+P → switch model); the llama log may say why",
                            during="generate",
                        )
                    )
                    if was_busy:
                        self._emit(RunDone(self._run_id))
                self._busy.clear()
                return
            if period and self._stop_reading.wait(period):
                return

    def flush(self) -> None:
        """Hand over every event that has arrived from the child, now, on this thread."""
        with self._read_lock:
            try:
                self._drain()
            except (EOFError, OSError):
                pass  # the reader thread reports it (the end of the pipe stays readable)

    def _drain(self) -> None:
        """Emit every event waiting in the pipe (hold `_read_lock`); raises EOFError or
        OSError when the child has gone."""
        events = self._events
        while events.poll():
            event = events.recv()
            if isinstance(event, RunDone):
                event = RunDone(self._run_id)  # the child counts its own runs
                self._unsubscribe()
                self._busy.clear()
            self._emit(event)
