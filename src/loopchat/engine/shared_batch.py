"""The running batch of a shared run (shared_run.py): `SharedBatch`, on the engine thread.

Each request is a `ReplyRun` of its own (run.py) on a `SlotHost` (slot_host.py): its own
prompt, prefill, sampler state, stop strings and max_tokens, its events handed to its own
`Ticket`. The batch drives the phases, as batch_run.py does for N replies to one prompt:

    admit       the requests that arrived: each one's Start, their prefills (between two
                passes, in one batch: joint_prefill.py; the running requests wait for it),
                each one's first draw
    draw        every live sequence draws from its row and records its Step
    pass        the tokens of those that go on, decoded in one llama_batch (one token per
                sequence, its logits kept)
    end         a sequence that ended (stop, max_tokens, error, its client gone) gets its
                Finish and its RunDone at once; its cells leave the cache

A request alone on sequence 0 runs exactly as a reply alone does (its pass is the engine's
own, `ReplyRun.feed_back`: the events and figures of `loopchat serve --parallel 1`). A pass
of two sequences or more is a `BatchPass` on each Step it gave (Step.batch), its
`single_ms` measured as batch_run.py measures it: one sequence's token decoded alone in a
scratch sequence at passes 1, 2, 3 and every 64th, the median of the latest three; a pass
none of whose requests shows batch figures (ReplyRequest.batch_probes: a served request with
the extension off) is not probed (a probe is a decode of the model's weights for one token).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

from loopchat.batch import SEQUENCES_MAX, BatchPass
from loopchat.engine.batch_run import PROBE_EVERY, PROBE_FIRST
from loopchat.engine.joint_prefill import joint_prefill
from loopchat.engine.run import ReplyRun
from loopchat.engine.slot_host import SlotHost
from loopchat.errors import ContextOverflowError, EngineError
from loopchat.events import FinishReason, Prefill, RunDone, WorkerError

#: the scratch sequence of the single-sequence probes (the requests' are 0..SEQUENCES_MAX - 1)
SCRATCH = SEQUENCES_MAX


class Ticket:
    """One request given to a shared run: its ReplyRequest, where its events go (`emit`, on
    the engine thread; the last is RunDone(run_id)), and its client's cancel."""

    def __init__(self, run_id: int, request: Any, emit: Callable[[Any], None]) -> None:
        self.run_id, self.request, self.emit = run_id, request, emit
        self.cancelled = False

    def is_cancelled(self) -> bool:
        return self.cancelled


@dataclasses.dataclass(eq=False)
class _Live:
    ticket: Ticket
    run: ReplyRun
    host: SlotHost
    token: int | None = None  # drawn, to be decoded by the next pass
    report: BatchPass | None = None  # the batched pass behind the next draw's logits


class SharedBatch:
    """The sequences running on `engine` (at most `slots`), from admission to end."""

    def __init__(self, engine: Any, slots: int, flush: Callable[[], None] = lambda: None) -> None:
        from loopchat.engine._batch_ffi import BatchCalls  # (loads llama.cpp: imported when a run starts)
        from loopchat.engine._slot_ffi import PrefillBatch

        self.engine, self.slots, self.flush = engine, slots, flush
        self.calls = BatchCalls(engine.llm, engine.n_vocab)
        self.prefill = PrefillBatch(engine.llm, engine.n_batch)
        self.live: list[_Live] = []
        self.faces: dict[int, tuple[str, bytes | None]] = {}  # every sequence's token faces (run.py)
        self.passes = 0  # batched passes (two sequences or more)
        self._probes: list[float] = []

    def has_room(self, joining: int = 0) -> bool:
        """Whether one more request can join, `joining` already admitted at this pass."""
        if len(self.live) + joining >= self.slots:
            return False
        used = {x.host.seq for x in self.live}
        free = sum(1 for s in range(1, SEQUENCES_MAX) if s not in used)
        return joining - (0 if self.live else 1) < free  # (the first to an idle run takes sequence 0)

    def _free_seq(self) -> int | None:
        """Sequence 0 when nothing runs (the engine's own), else a free one of 1..SEQUENCES_MAX - 1."""
        if not self.live:
            return 0
        used = {x.host.seq for x in self.live}
        return next((s for s in range(1, SEQUENCES_MAX) if s not in used), None)

    # ---------------------------------------------------------------- admit ----
    def admit_all(self, tickets: list[Ticket], more: Callable[[], list[Ticket]] = list) -> None:
        """Start the requests that join at this pass: each one's Start; sequence 0's prefill at
        once (nothing else runs: as a reply alone), the others' in one batch (joint_prefill.py);
        then each one's Prefill and first Step (or its end). `flush` (shared_run.py) after each
        Start and before the joint prefill: neither a Start nor a first token drawn already waits
        for a prefill. `more()` gives the requests that arrived meanwhile (shared_run.py): those
        that came during sequence 0's prefill join the joint one, those that came during the
        joint prefill are prefilled next, before the pass (not a pass and a prefill later)."""
        joining: list[tuple[_Live, Prefill]] = []
        while tickets:
            for ticket in tickets:
                live = self._open(ticket)
                self.flush()  # (its Start before its prefill: a server sends the response's head meanwhile)
                if live is None:
                    continue
                if not live.host.own:
                    self._started(live, live.run.prefill())
                else:
                    live.host.defer = True
                    joining.append((live, live.run.prefill()))
            tickets = more()  # (arrived during those prefills: in the same joint prefill)
            if joining and not tickets:
                self._joint(joining)
                joining = []
                tickets = more()  # (arrived during the joint prefill)

    def _joint(self, joining: list[tuple[_Live, Prefill]]) -> None:
        """The deferred prefills in one batch, then each one's Prefill and first Step, flushed."""
        self.flush()  # (sequence 0's first token, if it started here, before the others' prefill)
        jobs = [(live.host, live.run, event) for live, event in joining]
        for (live, _), event in zip(joining, joint_prefill(self.engine, self.prefill, self.calls, jobs)):
            self._started(live, event)
        self.flush()

    def _open(self, ticket: Ticket) -> _Live | None:
        """The request's sequence and Start (None: input the model cannot run, its error said)."""
        seq = self._free_seq()
        assert seq is not None  # (has_room() first)
        host = SlotHost(self.engine, seq, self.calls, self.prefill, ticket.is_cancelled, self.faces)
        run = ReplyRun(host, ticket.request)
        try:
            for event in run.open():
                ticket.emit(event)
        except EngineError as exc:  # this request's error only
            ticket.emit(WorkerError(str(exc), "generate", context_overflow=isinstance(exc, ContextOverflowError)))
            ticket.emit(RunDone(ticket.run_id))
            return None
        host.share_prefix(run.tokens)
        live = _Live(ticket, run, host)
        self.live.append(live)
        return live

    def _started(self, live: _Live, prefill: Prefill) -> None:
        live.ticket.emit(prefill)
        if live.run.reason is not None:  # the prefill failed or was cancelled
            self._end(live)
        else:
            self._draw(live)

    # ---------------------------------------------------------------- draw ----
    def draw_all(self) -> None:
        for live in list(self.live):
            if live.ticket.cancelled:  # its client left: it ends before it draws again
                live.run.reason = FinishReason.CANCELLED
                self._end(live)
            elif live.token is None:
                self._draw(live)

    def _draw(self, live: _Live) -> None:
        run = live.run
        drawn = run.draw_now()  # (no step mode here: it never waits)
        live.ticket.emit(run.record(drawn, live.report))
        if run.reason is None:
            live.token = drawn.result.token_id
        else:
            self._end(live)

    # ---------------------------------------------------------------- a pass ----
    def step(self) -> None:
        """One pass: a token of each sequence that goes on (a lone sequence 0: the engine's own pass)."""
        going = [x for x in self.live if x.token is not None]
        going = self._make_room(going)
        if not going:
            return
        if len(going) == 1 and going[0].host.seq == 0:
            self._alone(going[0])
            return
        self._batched(going)

    def _alone(self, live: _Live) -> None:
        token, live.token, live.report = live.token, None, None
        live.host.row = None  # (its logits: the engine's last)
        assert token is not None
        live.run.feed_back(token)
        if live.run.reason is not None:
            self._end(live)

    def _batched(self, going: list[_Live]) -> None:
        n = len(going)
        self.engine.prefill_threads(watch=True)  # (auto threads: the count in force; auto_threads.py)
        for live in going:
            live.run.threads.before_pass()
        if n > 1:
            self.passes += 1
            if self.passes in PROBE_FIRST or self.passes % PROBE_EVERY == 0:
                probed = next((x for x in going if x.run.request.batch_probes), None)
                if probed is not None:  # (None: no request of the pass shows batch figures)
                    self._probe(probed)
        triples = [(x.host.seq, x.token, x.host.n_past) for x in going]
        t0 = time.perf_counter()
        self.engine.passes += 1
        rc = self.calls.decode(triples)  # type: ignore[arg-type]
        ms = (time.perf_counter() - t0) * 1000.0
        if rc != 0:
            for live in going:
                live.host.rollback()
                live.run.reason = FinishReason.CANCELLED if rc == 2 else FinishReason.ERROR
                live.run.error = None if rc == 2 else f"llama.cpp failed to decode: llama_decode returned {rc}"
                self._end(live)
            return
        single = statistics.median(self._probes[-3:]) if self._probes else None
        report = BatchPass(self.passes, n, ms, single) if n > 1 else None
        rows = self.calls.rows(n)
        for i, live in enumerate(going):
            assert live.token is not None
            live.host.took(live.token, rows[i])
            live.token, live.report = None, report
            live.run.clock.forward_ms, live.run.clock.forward_tokens = ms, n
            live.run.threads.after_pass(self.engine.threads, 0.0)

    def _probe(self, live: _Live) -> None:
        """One sequence's pass at this context length, timed (batch_run.py's probe)."""
        calls, seq, pos = self.calls, live.host.seq, live.host.n_past
        calls.copy(seq, SCRATCH, -1)
        t0 = time.perf_counter()
        rc = calls.decode([(SCRATCH, live.token, pos)])  # type: ignore[list-item]
        ms = (time.perf_counter() - t0) * 1000.0
        calls.remove(SCRATCH, 0)
        if rc == 0:
            self._probes.append(ms)

    def _make_room(self, going: list[_Live]) -> list[_Live]:
        """The sequences that fit the cache for one more token each: sequence 0's kept cells
        are dropped first (when it runs no request), then the longest sequence ends (CONTEXT)."""
        engine = self.engine

        def used() -> int:
            idle0 = 0 if any(x.host.seq == 0 for x in self.live) else engine.n_past
            return idle0 + sum(x.host.n_past for x in self.live)

        if going and used() + len(going) > engine.n_ctx and not any(x.host.seq == 0 for x in self.live):
            self.calls.remove(0, 0)
            engine.keep_cached(0)
        while going and used() + len(going) > engine.n_ctx:
            longest = max(going, key=lambda x: x.host.n_past)
            going.remove(longest)
            longest.run.reason = FinishReason.CONTEXT
            self._end(longest)
        return going

    # ---------------------------------------------------------------- ends ----
    def _end(self, live: _Live) -> None:
        """The request's Finish and RunDone; its cells leave the cache (sequence 0's stay)."""
        if live in self.live:
            self.live.remove(live)
        ticket = live.ticket
        try:
            ticket.emit(live.run.finish())
        finally:
            live.host.free()
            ticket.emit(RunDone(ticket.run_id))

    def fail_all(self, error: WorkerError) -> None:
        """A bug in the loop: every running request gets its error and its RunDone."""
        for live in list(self.live):
            self.live.remove(live)
            live.host.free()
            live.ticket.emit(error)
            live.ticket.emit(RunDone(live.ticket.run_id))

    def close(self) -> None:
        self.calls.close()
        self.prefill.close()
        self.engine.end_reply()
