"""`loopchat serve --parallel N` (N > 1): requests share the engine's passes (`BatchLoop`).

The same face as loop.py's `OneLoop` (app.py cannot tell them apart): `begin` waits for a
place (at most `parallel` requests generate at once; at most `queue_limit` wait for a place,
one more gets `QueueFull`) and returns the request's `Run`, whose `events` queue receives
its own events up to its RunDone. Behind it the engine runs one `SharedRun`
(engine/shared_run.py): a request joins the running batch at the next pass and leaves it
when it ends; `cancel` (its client left) ends its sequence before the next pass while the
others go on.

Each request's events arrive on the engine thread through its own ticket and wait, with the
Run they belong to, in an outbox that the shared run's `flush` hands to the event loop whole
(loop.py's hand-off, handoff.py: the engine thread never waits for the event loop): one
hand-off a pass, carrying every request's events of that pass, made before the pass's decode
(engine/shared_run.py says when), its wake-up of the event loop made by the decode itself
(engine/pass_hook.py: the kernel's decode writes it once it has let go of the GIL). One
client's stream never carries another's events.
"""

from __future__ import annotations

import asyncio
from typing import Any

from loopchat.engine import pass_hook
from loopchat.engine.shared_batch import Ticket
from loopchat.engine.shared_run import SharedRun
from loopchat.events import RunDone, Step
from loopchat.serve.loop import OneLoop, QueueFull, Run, ShuttingDown
from loopchat.serve.requests import GenerationRequest


class BatchLoop(OneLoop):
    def __init__(self, queue_limit: int, parallel: int) -> None:
        super().__init__(queue_limit)
        self.parallel = parallel
        self.turns = f"runs {parallel} generations at once (--parallel)"
        self.shared = SharedRun(parallel, self._flush, self._flush_for_pass)
        self._outbox: list[tuple[Run, Any]] = []  # (the engine thread's) events since the last flush
        self.generating = 0  # requests with a place (running, or about to join the batch)
        self._places: asyncio.Semaphore | None = None
        self._tickets: dict[int, Ticket] = {}
        self._next_id = 0

    def attach(self) -> None:
        super().attach()
        self._places = asyncio.Semaphore(self.parallel)
        assert self._handoff is not None
        pass_hook.before_decode.append(self._handoff)  # (the wake-up a pass's tokens owe: _flush_for_pass)

    def detach(self) -> None:
        if self._handoff in pass_hook.before_decode:  # (attached: the one this loop appended)
            pass_hook.before_decode.remove(self._handoff)
        super().detach()

    def _dispatch(self, item: Any) -> None:
        """(The event loop.) The hand-off's callback: a flush's (Run, event) pairs, in order."""
        for run, event in item:
            self._deliver(run, event)

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
        """(The engine thread.) The event waits in the outbox with its Run until the pass's flush."""
        if isinstance(event, Step):
            run.steps += 1
        self._outbox.append((run, event))

    def _flush(self, for_pass: bool = False) -> None:
        """(The engine thread: SharedRun's flush.) The outbox to the hand-off in one put: the
        engine thread returns at once, and a pass of N requests wakes the event loop once."""
        handoff = self._handoff
        if not self._outbox:
            if handoff is not None:
                handoff.pay()  # (a wake-up still owed by a flush for a pass that made no decode)
            return
        box, self._outbox = self._outbox, []
        if handoff is not None:
            handoff.put(box, soon=for_pass)

    def _flush_for_pass(self) -> None:
        """(The engine thread: SharedRun's flush right before a pass.) The outbox handed over,
        the event loop's wake-up left to the pass's decode (engine/pass_hook.py), a
        microsecond before the pass lets go of the GIL (or to the next flush, if no decode
        comes)."""
        self._flush(for_pass=True)

    def _deliver(self, run: Run, event: Any) -> None:
        run.record(event, self.closing)
        if isinstance(event, RunDone):
            self._tickets.pop(run.run_id, None)
            self.generating -= 1
            if run.on_done is not None:
                run.on_done(run)
            assert self._places is not None
            self._places.release()


__all__ = ["BatchLoop"]
