"""`loopchat serve --parallel N` (N > 1): requests share the engine's passes (`BatchLoop`).

The same face as loop.py's `OneLoop` (app.py cannot tell them apart): `begin` waits for a
place (at most `parallel` requests generate at once; at most `queue_limit` wait for a place,
one more gets `QueueFull`) and returns the request's `Run`, whose `events` queue receives
its own events up to its RunDone. Behind it the engine runs one `SharedRun`
(engine/shared_run.py): a request joins the running batch at the next pass and leaves it
when it ends; `cancel` (its client left) ends its sequence before the next pass while the
others go on.

Each request's events arrive on the engine thread through its own ticket, and are handed
to the event loop (`call_soon_threadsafe`) with the Run they belong to: one client's
stream never carries another's events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

from loopchat.engine.shared_batch import Ticket
from loopchat.engine.shared_run import SharedRun
from loopchat.events import Finish, FinishReason, Prefill, RunDone, Start, Step, WorkerError
from loopchat.serve.loop import SERVER_STOPPED, OneLoop, QueueFull, Run, ShuttingDown
from loopchat.serve.requests import GenerationRequest


class BatchLoop(OneLoop):
    def __init__(self, queue_limit: int, parallel: int) -> None:
        super().__init__(queue_limit)
        self.parallel = parallel
        self.turns = f"runs {parallel} generations at once (--parallel)"
        self.shared = SharedRun(parallel)
        self.generating = 0  # requests with a place (running, or about to join the batch)
        self._places: asyncio.Semaphore | None = None
        self._tickets: dict[int, Ticket] = {}
        self._next_id = 0
        self._outbox: list[tuple[Run, Any]] = []  # events from the engine thread, not yet delivered
        self._outbox_lock = threading.Lock()
        self._drain_due = False  # a _drain is scheduled on the event loop

    def attach(self) -> None:
        super().attach()
        self._places = asyncio.Semaphore(self.parallel)

    @property
    def busy(self) -> bool:
        return self.generating > 0

    async def begin(self, request: GenerationRequest) -> Run:
        """Wait for a place, then hand `request` to the shared run."""
        places = self._places
        assert places is not None, "attach() first"
        if self.closing:
            raise ShuttingDown()
        if places.locked() and self.waiting >= self.queue_limit:
            raise QueueFull()
        self.waiting += 1
        try:
            await places.acquire()
        finally:
            self.waiting -= 1
        if self.closing:
            places.release()
            raise ShuttingDown()
        run = Run()
        self.runs += 1
        self.generating += 1
        self._next_id += 1
        run.run_id = self._next_id
        ticket = self._tickets[run.run_id] = Ticket(run.run_id, request.reply, lambda event: self._emit_to(run, event))
        if self.shared.submit(ticket):
            self.worker.call(self.shared.serve)
        return run

    def cancel(self, run: Run) -> None:
        """The client of `run` left: its sequence ends before the next pass."""
        if run.done or run.left_at is not None:
            return
        run.left_at = run.steps
        ticket = self._tickets.get(run.run_id)
        if ticket is not None:
            self.shared.cancel(ticket)

    def stop(self) -> None:
        self.closing = True
        self.shared.cancel_all()
        self.worker.cancel()

    # ---- the engine thread, then the event loop ----------------------------------------
    def _emit_to(self, run: Run, event: Any) -> None:
        """(The engine thread.) The events wait in `_outbox` for one call on the event loop that
        delivers every one there: a pass of N requests wakes the loop once, not N times (each
        wake a hand-over of the GIL between the two threads, slow on a loaded machine)."""
        if isinstance(event, Step):
            run.steps += 1
        loop = self._loop
        if loop is None:
            return
        with self._outbox_lock:
            self._outbox.append((run, event))
            if self._drain_due:
                return
            self._drain_due = True
        try:
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the event loop has closed (shutting down): nobody to tell
            pass

    def _drain(self) -> None:
        with self._outbox_lock:
            ready, self._outbox = self._outbox, []
            self._drain_due = False
        for run, event in ready:
            self._deliver(run, event)

    def _deliver(self, run: Run, event: Any) -> None:
        if isinstance(event, Start):
            run.start = event
        elif isinstance(event, Prefill):
            run.prefill = event
        elif isinstance(event, Finish):
            if self.closing and event.reason == FinishReason.CANCELLED and event.error is None:
                event = dataclasses.replace(event, error=SERVER_STOPPED)
            run.finish = event
        elif isinstance(event, WorkerError):
            run.error = event
        run.events.put_nowait(event)
        if isinstance(event, RunDone):
            run.done = True
            self._tickets.pop(run.run_id, None)
            self.generating -= 1
            if run.on_done is not None:
                run.on_done(run)
            assert self._places is not None
            self._places.release()


__all__ = ["BatchLoop"]
