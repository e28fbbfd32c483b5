"""`loopchat serve`: one model, one loop, requests take turns.

One EngineWorker (worker.py) owns the Engine. `OneLoop.begin` waits for the loop to be
free (at most `queue_limit` requests wait; one more gets `QueueFull`), starts the
request's generation (its ReplyRequest, passed whole) and returns its `Run`, whose
`events` queue receives the run's events up to its RunDone. The turn passes on at that RunDone, whoever is (or is no
longer) reading: a client that went away cannot hold the loop, and the next run's
events can never mix with the last one's.

The worker's events arrive on the engine thread; `_emit` hands them to the event loop
(handoff.py: the engine thread wakes it itself, never waiting for it) and counts the run's steps there, so `cancel` knows how many
steps the engine had produced when the client left, and the request's log line can say
how many ran after.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
from collections.abc import Callable
from typing import Any

from loopchat.engine.options import EngineOptions
from loopchat.engine.worker import EngineWorker
from loopchat.events import Finish, FinishReason, ModelReady, Prefill, RunDone, Start, Step, WorkerError
from loopchat.serve.handoff import Handoff
from loopchat.serve.requests import GenerationRequest

#: Finish.error of the reply in progress when the server is stopped (Ctrl+C, SIGTERM).
SERVER_STOPPED = "the server was stopped during this reply"


class QueueFull(Exception):
    """The loop is busy and `queue_limit` requests already wait."""


class ShuttingDown(Exception):
    """The server is stopping: no new generations."""


class LoadFailed(Exception):
    """The model did not load (the message is the worker's one line)."""


class Run:
    """One request's generation, as the loop sees it."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        self.run_id = 0
        self.steps = 0  # Step events the engine emitted so far (counted on the engine thread)
        self.start: Start | None = None
        self.prefill: Prefill | None = None
        self.finish: Finish | None = None
        self.error: WorkerError | None = None
        self.left_at: int | None = None  # steps emitted when the client was seen to leave
        self.done = False
        self.on_done: Callable[[Run], None] | None = None

    def record(self, event: Any, closing: bool) -> None:
        """(The event loop.) Keep what the request's end needs of `event` and queue it for the
        client; `closing`: the server is stopping (a cancelled finish then says so)."""
        if type(event) is Step:  # (a token's: kept by no field, and most events are)
            self.events.put_nowait(event)
            return
        if isinstance(event, Start):
            self.start = event
        elif isinstance(event, Prefill):
            self.prefill = event
        elif isinstance(event, Finish):
            if closing and event.reason == FinishReason.CANCELLED and event.error is None:
                # not the client's doing: its finish chunk says why (a loopchat client shows it)
                event = dataclasses.replace(event, error=SERVER_STOPPED)
            self.finish = event
        elif isinstance(event, WorkerError):
            self.error = event
        self.events.put_nowait(event)
        if isinstance(event, RunDone):
            self.done = True


class OneLoop:
    parallel = 1  # requests generating at once (batch_loop.py's BatchLoop: --parallel N)
    turns = "runs one generation at a time"  # (the 429's line)

    def __init__(self, queue_limit: int = 8) -> None:
        self.queue_limit = queue_limit
        self.waiting = 0  # requests waiting for their turn
        self.runs = 0  # generations started
        self.closing = False
        self._handoff: Handoff | None = None  # to the event loop, once attached
        self._lock: asyncio.Lock | None = None
        self._current: Run | None = None
        self._before: queue.Queue[Any] = queue.Queue()  # what the worker says before the server runs
        self.worker = EngineWorker(self._emit, name="loopchat-serve-engine")

    # ---- before serving: load the model (blocking) --------------------------------
    def load(self, options: EngineOptions, name: str, path: str) -> ModelReady:
        self.worker.load(options, name, path)
        while True:
            event = self._before.get()
            if isinstance(event, ModelReady):
                return event
            if isinstance(event, WorkerError):
                raise LoadFailed(event.message)

    # ---- on the event loop -----------------------------------------------------------
    def attach(self) -> None:
        """Start handing the worker's events to the running event loop."""
        self._lock = asyncio.Lock()
        self._handoff = Handoff(asyncio.get_running_loop(), self._dispatch)

    def detach(self) -> None:
        handoff, self._handoff = self._handoff, None
        if handoff is not None:
            handoff.close()

    @property
    def busy(self) -> bool:
        return self._current is not None

    async def begin(self, request: GenerationRequest) -> Run:
        """Wait for the loop, then start `request`'s generation."""
        assert self._lock is not None, "attach() first"
        if self.closing:
            raise ShuttingDown()
        if self._lock.locked() and self.waiting >= self.queue_limit:
            raise QueueFull()
        self.waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1
        if self.closing:
            self._lock.release()
            raise ShuttingDown()
        run = Run()
        self._current = run
        self.runs += 1
        run.run_id = self.worker.generate(request.reply)
        return run

    def cancel(self, run: Run) -> None:
        """The client of `run` left: stop its generation (within one step)."""
        if run.done or run.left_at is not None:
            return
        run.left_at = run.steps
        self.worker.cancel()

    def _dispatch(self, event: Any) -> None:
        run = self._current
        if run is None:  # pragma: no cover - every event belongs to the run in progress
            return
        run.record(event, self.closing)
        if isinstance(event, RunDone):
            self._current = None
            if run.on_done is not None:
                run.on_done(run)
            assert self._lock is not None
            self._lock.release()

    # ---- any thread ------------------------------------------------------------------
    def _emit(self, event: Any) -> None:
        """The worker's callback (engine thread)."""
        run = self._current
        if run is not None:
            if isinstance(event, Step):
                run.steps += 1
            if run.left_at is not None:  # (a cancel made before its generation began: the engine
                self.worker.cancel()  # clears its flag as a reply starts, so it is said again)
        handoff = self._handoff
        if handoff is None:
            self._before.put(event)
            return
        handoff.put(event)

    def stop(self) -> None:
        """Stop taking requests and cancel the generation in progress (a signal handler
        may call it: it only sets flags)."""
        self.closing = True
        self.worker.cancel()

    def close(self) -> None:
        """Close the engine (after the server has stopped)."""
        self.closing = True
        self.detach()
        self.worker.close()
