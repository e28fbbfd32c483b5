"""Continuous batching: requests that share the engine's passes (`SharedRun`).

Any thread `submit`s a request (a `Ticket`: its ReplyRequest whole, and where its events go).
The engine thread runs `serve(engine)` (EngineWorker.call) while any request is running or
waiting: between two passes the requests that arrived join the running batch (up to
`slots` at once: shared_batch.py admits them, each with its own prompt and prefill); every
pass decodes one token of each running request in one llama_batch; a request that ends
leaves at once, its cells freed. `serve` returns when nothing runs and nothing waits; the
next `submit` says to start it again (it returns True).

A request the batch cannot carry runs alone, as `Engine.run_reply` runs it, once the
requests before it have ended (the ones after it wait meanwhile): N replies to one prompt
(n > 1: already a batch of its own, batch_run.py), the logit lens, prompt logprobs (their
scored prefill is the engine's own), speculative decoding (its verifying passes), step mode.

The events of a pass go out together: `flush` (the constructor's, on the engine thread) is
called once the running requests have drawn if a request waits to join (before its
prefill), `flush_for_pass` once the joining ones have drawn too (their first tokens), right
before the pass's decode, and `flush` after each event of a request running alone. A
server hands what its tickets emitted since the last flush to its event loop in one go
(serve/batch_loop.py): one wake-up a pass, not one a token, and no token waits for a decode.

A client that goes `cancel`s its ticket: its sequence ends before the next pass draws
(its Finish says cancelled), the others go on; `cancel_all` (the server stopping) ends
every one and aborts the pass in progress.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from loopchat.engine.shared_batch import SharedBatch, Ticket
from loopchat.engine.worker import _internal_error
from loopchat.errors import ContextOverflowError, EngineError
from loopchat.events import RunDone, WorkerError
from loopchat.request import ReplyRequest


def runs_alone(request: ReplyRequest) -> bool:
    """Whether `request` needs the engine to itself (the module's docstring says why)."""
    return (
        request.n != 1
        or request.lens
        or request.prompt_logprobs is not None
        or request.step_paused
        or request.settings.draft != "off"
        or bool(request.prediction)
        or bool(request.draft_plan)
    )


class SharedRun:
    """Requests sharing one engine's passes, at most `slots` at once (1..SEQUENCES_MAX)."""

    def __init__(
        self, slots: int, flush: Callable[[], None] = lambda: None, flush_for_pass: Callable[[], None] | None = None
    ) -> None:
        self.slots = slots
        self._flush = flush
        # the flush right before a pass (its tokens): a server may leave its wake-up to the
        # pass's decode (engine/pass_hook.py); `flush` where none is given
        self._flush_for_pass = flush if flush_for_pass is None else flush_for_pass
        self._lock = threading.Lock()
        self._inbox: deque[Ticket] = deque()
        self._serving = False
        self._engine: Any = None
        self._alone: Ticket | None = None  # the request running alone now, if any
        self._stopping = False

    # ---------------------------------------------------------------- any thread ----
    def submit(self, ticket: Ticket) -> bool:
        """Queue `ticket`; True: nothing is serving, so start `serve` on the engine thread."""
        with self._lock:
            self._inbox.append(ticket)
            if self._serving:
                return False
            self._serving = True
            return True

    def cancel(self, ticket: Ticket) -> None:
        """The ticket's client left: its sequence ends at the next pass (a request running
        alone: within one step, as the engine cancels)."""
        ticket.cancelled = True
        engine = self._engine
        if self._alone is ticket and engine is not None:
            engine.cancel()

    def cancel_all(self) -> None:
        """The server stops: every request ends, the pass in progress is aborted."""
        with self._lock:
            tickets = list(self._inbox)
        for ticket in tickets:
            ticket.cancelled = True
        engine = self._engine
        self._stopping = True
        if engine is not None:
            engine.cancel()

    # ---------------------------------------------------------------- engine thread ----
    def serve(self, engine: Any) -> None:
        """Run every request submitted until none runs and none waits."""
        try:
            self._serve(engine)
        finally:
            self._flush()

    def _serve(self, engine: Any) -> None:
        if engine is None:
            self._refuse_all(WorkerError("no model is loaded: pick one with --model", during="generate"))
            return
        self._engine = engine
        engine.end_reply()  # (an abort left from a cancel that came after its run ended)
        batch = SharedBatch(engine, self.slots, self._flush)
        try:
            while self._more(batch):
                batch.draw_all()
                if self._inbox:
                    self._flush()  # (the running requests' tokens: before a joining request's prefill)
                self._admit(batch)
                self._flush_for_pass()  # (the tokens drawn, the joining requests' first ones)
                batch.step()
        except Exception as exc:  # a bug: every running request gets its error
            batch.fail_all(_internal_error(exc, "generate"))
            self._refuse_all(_internal_error(exc, "generate"))
        finally:
            batch.close()

    def _more(self, batch: SharedBatch) -> bool:
        with self._lock:
            if batch.live or self._inbox:
                if self._stopping:
                    for live in batch.live:
                        live.ticket.cancelled = True
                return True
            self._serving = False
            return False

    def _admit(self, batch: SharedBatch) -> None:
        """The requests waiting join, in order, while there is room, all at this pass (one that
        runs alone waits for the batch to end, and the ones after it wait for it). Those that
        arrive while the first of an idle run is prefilled alone join the same joint prefill
        (`SharedBatch.admit_all` asks for them before it): not one pass and one prefill later."""
        joining = self._joining(batch, alone_ok=True)
        if joining:
            batch.admit_all(joining, lambda: self._joining(batch, alone_ok=False))

    def _joining(self, batch: SharedBatch, alone_ok: bool) -> list[Ticket]:
        """The waiting requests that join now (a request that runs alone runs here if `alone_ok`
        and nothing else runs; a cancelled one ends)."""
        joining: list[Ticket] = []
        while True:
            with self._lock:
                if not self._inbox:
                    break
                head = self._inbox[0]
                alone = runs_alone(head.request)
                taken = len(joining)
                if (alone and (batch.live or taken or not alone_ok)) or (not alone and not batch.has_room(taken)):
                    break
                self._inbox.popleft()
            if head.cancelled:  # its client left before it started
                head.emit(RunDone(head.run_id))
            elif alone:
                self._run_alone(head)
            else:
                joining.append(head)
        return joining

    def _run_alone(self, ticket: Ticket) -> None:
        engine = self._engine
        self._alone = ticket
        try:
            for event in engine.run_reply(ticket.request):
                ticket.emit(event)
                self._flush()
                if ticket.cancelled:  # (a cancel before run_reply cleared the engine's flag)
                    engine.cancel()
        except EngineError as exc:
            ticket.emit(WorkerError(str(exc), "generate", context_overflow=isinstance(exc, ContextOverflowError)))
        except Exception as exc:  # a bug: this request's error, as the worker reports it
            ticket.emit(_internal_error(exc, "generate"))
        finally:
            self._alone = None
            engine.end_reply()
            ticket.emit(RunDone(ticket.run_id))

    def _refuse_all(self, error: WorkerError) -> None:
        with self._lock:
            tickets = list(self._inbox)
            self._inbox.clear()
            self._serving = False
        for ticket in tickets:
            ticket.emit(error)
            ticket.emit(RunDone(ticket.run_id))


__all__ = ["SharedRun", "Ticket", "runs_alone"]
