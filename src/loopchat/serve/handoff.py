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
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

_STOP = object()


class Handoff:
    """Calls `dispatch(event)` on `loop`'s thread for each event `put` from any thread, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, dispatch: Callable[[Any], None]) -> None:
        self._loop = loop
        self._dispatch = dispatch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="loopchat-serve-handoff", daemon=True)
        self._thread.start()

    def put(self, event: Any) -> None:
        """Any thread; returns at once (never waits for the GIL or the event loop)."""
        self._queue.put(event)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (the events put before are still handed over, if the loop runs)."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def _main(self) -> None:
        q = self._queue
        get, get_nowait, empty = q.get, q.get_nowait, q.empty
        while True:
            # what came meanwhile goes in the same wake-up (empty(), not get_nowait's Empty: no
            # exception raised and caught at every wake-up, a token's)
            batch = [get()]
            while not empty():
                batch.append(get_nowait())
            stop = False
            for i, e in enumerate(batch):
                if e is _STOP:  # (nothing is put after close)
                    batch, stop = batch[:i], True
                    break
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
