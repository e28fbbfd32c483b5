"""The engine thread's events to the event loop, without the engine thread waiting for it.

`loop.call_soon_threadsafe` wakes the event loop by writing a byte to its self-pipe; the
write releases the GIL, the woken event loop takes it and serializes and sends the
token's chunk (~0.6 ms of Python), and the engine thread, back from the write, waits for
the GIL through all of it before it can start the next forward pass: every token's
pass started that much later (docs/performance.md, "`loopchat serve`'s hand-off"; on a
loaded machine, longer: the event loop may be descheduled while it holds the GIL).

Here the engine thread only puts the event on a `queue.SimpleQueue` (C code that never
releases the GIL) and goes on into the forward pass, which releases it. A hand-off thread
blocked on the queue then wakes the event loop: the loop's work runs beside the pass, not
before it. Events keep their order (one queue, one thread, one callback per wake-up);
what has queued up meanwhile goes in one wake-up.

Neither the hand-off thread nor the event loop's takes the engine thread's core when it
wakes (`yield_on_wake`, SCHED_BATCH): woken as the engine thread lets go of the GIL to
start its pass, either one used to preempt it there, and the pass started only after the
loop had serialized and sent the chunk (0.4 ms a token at the median, up to 9 ms at p99
on a loaded 2-core machine: docs/performance.md, "The engine thread's core at the
pass's start"). They now run on a free core, or when the scheduler's tick gives them one.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

_STOP = object()


def yield_on_wake() -> int | None:
    """The calling thread, woken, no longer preempts the thread running on the core it
    wakes on (Linux's SCHED_BATCH: the same share of the CPU, no wake-up preemption).
    Returns the policy it had (for `restore_policy`); None where there is no such policy."""
    try:
        before = os.sched_getscheduler(0)
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or not allowed: as before
        return None
    return before


def restore_policy(policy: int | None) -> None:
    """The calling thread's policy back to what `yield_on_wake` returned."""
    if policy is not None:
        try:
            os.sched_setscheduler(0, policy, os.sched_param(0))
        except OSError:  # pragma: no cover - a policy the thread had, refused back
            pass


class Handoff:
    """Calls `dispatch(event)` on `loop`'s thread for each event `put` from any thread, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, dispatch: Callable[[Any], None]) -> None:
        self._loop = loop
        self._dispatch = dispatch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="loopchat-serve-handoff", daemon=True)
        self._thread.start()

    @property
    def thread_id(self) -> int | None:
        """The hand-off thread's id in the OS (its scheduling policy: `yield_on_wake`)."""
        return self._thread.native_id

    def put(self, event: Any) -> None:
        """Any thread; returns at once (never waits for the GIL or the event loop)."""
        self._queue.put(event)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (the events put before are still handed over, if the loop runs)."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def _main(self) -> None:
        yield_on_wake()
        get, get_nowait = self._queue.get, self._queue.get_nowait
        while True:
            batch = [get()]
            while True:  # what came meanwhile: one wake-up for all of it
                try:
                    batch.append(get_nowait())
                except queue.Empty:
                    break
            stop = any(e is _STOP for e in batch)
            if stop:  # (nothing is put after close)
                batch = batch[: next(i for i, e in enumerate(batch) if e is _STOP)]
            if batch:
                try:
                    self._loop.call_soon_threadsafe(self._run, batch)
                except RuntimeError:  # the event loop has closed (shutting down): nobody to tell
                    return
            if stop:
                return

    def _run(self, batch: list[Any]) -> None:
        for event in batch:
            self._dispatch(event)
