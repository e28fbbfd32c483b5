"""Ends a forward pass that runs past a deadline: the auto thread count's probes.

A probe runs a few passes at a thread count not yet measured (thread_tuner.py). On a
busy 2-core machine one such pass at 2 threads can take far longer than one at 1
(docs/performance.md, "Auto threads"; llama.cpp's threads meet at an OpenMP barrier at
every graph node; when the OS deschedules one, the other spins). The engine arms this
guard before such a pass; if the pass is still running at the deadline, the guard sets
the engine's abort flag (_llama_ffi.AbortFlag, which ggml reads at every graph node from
C), llama_decode returns 2 within a node or two, and the engine redoes the pass at the
safe count.

The abort flag is the one Esc's cancel sets too: the guard only ever sets it while a
pass it armed runs, and clears it afterwards only if it set it and no cancel came
(`cancelled()`), so a cancel is never lost and a cut is never taken for a cancel.

One watchdog thread per guard, started at the first `arm`, sleeping on a condition
between deadlines: arming costs a lock and a notify, not a thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol


class Flag(Protocol):
    def set(self) -> None: ...
    def clear(self) -> None: ...


class PassGuard:
    def __init__(self, flag: Flag, cancelled: Callable[[], bool]) -> None:
        self._flag = flag
        self._cancelled = cancelled
        self._cond = threading.Condition()
        self._deadline: float | None = None  # perf_counter() seconds; None: not armed
        self._fired = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._waking: float | None = None  # the deadline the watchdog sleeps until (None: idle)

    def arm(self, limit_ms: float) -> None:
        """The next pass may run `limit_ms` from now; past that, the flag is set."""
        deadline = time.perf_counter() + limit_ms / 1000.0
        with self._cond:
            self._deadline = deadline
            self._fired = False
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="loopchat-probe-guard", daemon=True)
                self._thread.start()
            elif self._waking is None or deadline < self._waking:
                self._cond.notify()  # (else it wakes at an earlier deadline and sees this one)

    def disarm(self) -> bool:
        """The pass has returned: whether the guard set the flag during it (the flag is
        cleared again unless a cancel came meanwhile)."""
        with self._cond:
            self._deadline = None
            fired, self._fired = self._fired, False
            if fired and not self._cancelled():
                self._flag.clear()
            return fired

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                if self._deadline is None:
                    self._waking = None
                    self._cond.wait()
                    continue
                left = self._deadline - time.perf_counter()
                if left > 0:
                    self._waking = self._deadline
                    self._cond.wait(left)
                    continue
                self._deadline = None
                self._fired = True
                self._flag.set()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._deadline = None
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)
