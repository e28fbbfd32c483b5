"""N replies to one prompt in one batch (batch.py says what the events are): `BatchRun`.

Each sequence is a `ReplyRun` of its own (run.py), so every step is drawn, recorded and
ended exactly as a reply alone is: its own sampler state (DRY and penalty history, its own
random stream), its own stop strings and max_tokens. It reaches the model through a
`SequenceHost`: the engine, with this sequence's logits row and position. The batch run
drives the phases:

    open        every sequence's Start (the prompt fitted once per sequence; refused in one
                line, before any event, when N replies cannot fit the context)
    prefill     sequence 0's prefill (KV reuse as a reply alone); then its cells are shared
                with sequences 1..N-1 (llama_memory_seq_cp: no data copied)
    per pass    every live sequence draws from its row and records its Step; the tokens of
                those that go on are decoded in one llama_batch (one token per sequence, its
                logits kept); a sequence that ended gets its Finish and its cells removed
    finish      the cache is left holding the prompt as sequence 0, as after a reply alone

The cost of a pass against one sequence (BatchPass.single_ms) is measured, not assumed: at
passes 1, 2, 3 and every 64th, before the batched decode, the first live sequence's token is
decoded alone in a scratch sequence (a copy of its cells, removed after), at the same
position; `single_ms` is the median of the latest three such probes.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeAlias, cast

import numpy as np

from loopchat.batch import BatchPass, check_n, fit_problem
from loopchat.engine import dry
from loopchat.engine.run import ReplyRun
from loopchat.engine.run_host import RunHost
from loopchat.engine.run_settings import ReplySettings
from loopchat.errors import ContextOverflowError, EngineError
from loopchat.events import Event, Finish, FinishReason, Pending, Start
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings, new_seed

#: the single-sequence probes: at these pass numbers, and every PROBE_EVERY passes. Each is a pass of
#: the model's weights for one token, between two batched passes: ~3% of a 48-token round of 4 and
#: ~1.4% of a 256-token one every 32 passes; every 64 leaves 3 in 47 and 6 in 255 (the figure, the
#: median of the latest three, moved less with 500 tokens of context than from pass to pass under
#: load: docs/performance.md, "The event loop's work per chunk, and the batch's probes")
PROBE_FIRST = (1, 2, 3)
PROBE_EVERY = 64


class SequenceHost:
    """One sequence of a batch as its ReplyRun sees the model: the engine (every attribute but
    these), with the logits of this sequence's row of the last batched pass and its position."""

    def __init__(self, engine: Any, seq: int) -> None:
        self._engine = engine
        self.seq = seq
        dry.stands_for(self, engine)  # (DRY's breakers: the engine's, found once)
        # what a draw and its Step ask of the model each token, bound here: not __getattr__ (a
        # failed lookup, then the engine's) a dozen times a sequence a pass
        self.piece, self.piece_text, self.is_eog = engine.piece, engine.piece_text, engine.is_eog
        self.n_ctx, self.n_vocab = engine.n_ctx, engine.n_vocab
        self.row: np.ndarray | None = None  # None: the prefill's logits (the engine's last)
        self.pos: int | None = None  # tokens in this sequence's context (None: the engine's n_past)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def logits(self) -> np.ndarray:
        return self._engine.logits() if self.row is None else self.row

    @property
    def n_past(self) -> int:
        return int(self._engine.n_past) if self.pos is None else self.pos

    def end_reply(self) -> None:  # the batch run ends the engine's reply once, at its end
        pass


class _SeededSource:
    """Sequence j's settings: the live source's, with the seed the reply's + j (a pinned seed
    s gives s + j; modulo 2^32), one object per object of the source (run_settings.py
    resolves a new object once)."""

    def __init__(self, source: Callable[[], SamplingSettings], reply_seed: int, j: int) -> None:
        self._source, self._seed, self._j = source, reply_seed, j
        self._raw: SamplingSettings | None = None
        self._now: SamplingSettings | None = None

    def __call__(self) -> SamplingSettings:
        latest = self._source()
        if latest is not self._raw or self._now is None:
            seed = self._seed if latest.seed is None else latest.seed
            self._raw, self._now = latest, latest.replace(seed=(seed + self._j) % 2**32)
        return self._now


class _NoGate:
    probe = None  # Engine.pending_probs: a batch never stops for the user


class BatchRun:
    """N replies to `request` (request.n of them) on `engine`, in one batch."""

    gate = _NoGate()
    constraint: Any = None  # (Engine.pending_probs reads it with the gate's probe, which is None here)

    def __init__(
        self, engine: Any, request: ReplyRequest, live: Callable[[], SamplingSettings] | None, control: Any
    ) -> None:
        try:
            self.n = check_n(request.n)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        if request.step_paused or (control is not None and control.paused):
            raise EngineError("step mode writes one reply at a time: ask for n=1, or leave step mode")
        if request.lens:
            raise EngineError("the logit lens reads one reply at a time: ask for n=1, or turn the lens off")
        self.engine = engine
        self.request = request
        fixed = request.settings
        source = live if live is not None else (lambda: fixed)
        seed = new_seed()
        self.hosts = [SequenceHost(engine, j) for j in range(self.n)]
        self.runs = [ReplyRun(cast(RunHost, h), request) for h in self.hosts]
        for j, run in enumerate(self.runs):
            run.settings = ReplySettings(_SeededSource(source, seed, j), seed)
        from loopchat.engine._batch_ffi import BatchCalls  # (loads llama.cpp: imported when a batch runs)

        self.calls = BatchCalls(engine.llm, engine.n_vocab)
        self._shared = False  # the prompt's cells shared: the close gives the cache back as it was
        self.prompt = 0  # the shared prompt's tokens (set at the open)
        self.passes = 0
        self._probes: list[float] = []

    # ---------------------------------------------------------------- driver ----
    def events(self) -> Iterator[Event | Pending]:
        try:
            yield from self._open()
            prefill = self.runs[0].prefill()
            self._share()
            yield prefill
            yield from self._passes()
        finally:
            self._close()

    def _open(self) -> Iterator[Event]:
        opened = [list(run.open()) for run in self.runs]  # (EngineError: before any event)
        run0 = self.runs[0]
        self.prompt = len(run0.tokens)
        problem = fit_problem(self.prompt, self.n, run0.settings.now.max_tokens, self.engine.n_ctx)
        if problem is not None:
            raise ContextOverflowError(problem)
        for j, events in enumerate(opened):
            for event in events:
                if isinstance(event, Start):
                    yield dataclasses.replace(event, sequence=j, sequences=self.n)
                elif j == 0:  # a ContextTrimmed: the prompt's, said once
                    yield event

    def _share(self) -> None:
        """After sequence 0's prefill: the others start from the same state and cells."""
        run0 = self.runs[0]
        for run in self.runs[1:]:
            run.reason, run.error = run0.reason, run0.error
            run.ready()
            for name in ("prefill_ms", "forward_ms", "forward_tokens"):
                setattr(run.clock, name, getattr(run0.clock, name))
            self.calls.copy(0, run.host.seq, self.prompt)  # type: ignore[attr-defined]
        for host in self.hosts:
            host.pos = self.prompt
        self._shared = True

    def _passes(self) -> Iterator[Event | Pending]:
        live = [run for run in self.runs if run.reason is None]
        for run in self.runs:
            if run.reason is not None:  # the prefill failed or was cancelled
                yield self._end(run)
        report: BatchPass | None = None
        while live:
            going: list[tuple[ReplyRun, int]] = []
            for run in live:
                drawn = yield from run.draw()  # (no step mode in a batch: it never waits)
                assert drawn is not None
                step = run.record(drawn)
                yield dataclasses.replace(step, sequence=self._seq(run), batch=report)
                if run.reason is None:
                    going.append((run, drawn.result.token_id))
                else:
                    yield self._end(run)
            live = [run for run, _ in going]
            if not live:
                break
            report = self._pass(going)
            if report is None:  # the pass failed, was cancelled, or the cache is full: every live one ends
                for run in live:
                    yield self._end(run)
                break

    # ---------------------------------------------------------------- a pass ----
    def _pass(self, going: list[tuple[ReplyRun, int]]) -> BatchPass | None:
        """One token of each going sequence through the model in one batch (None: it ended them)."""
        engine = self.engine
        cells = self.prompt + sum(self._host(run).n_past - self.prompt for run, _ in going)
        if cells + len(going) > engine.n_ctx:  # (a live max_tokens raise: no cell left for the pass)
            for run, _ in going:
                run.reason = FinishReason.CONTEXT
            return None
        self.passes += 1
        number = self.passes
        engine.prefill_threads(watch=True)  # (auto threads: the count in force; auto_threads.py)
        for run, _ in going:
            run.threads.before_pass()
        if number in PROBE_FIRST or number % PROBE_EVERY == 0:
            self._probe(*going[0])
        triples = [(self._seq(run), token, self._host(run).n_past) for run, token in going]
        t0 = time.perf_counter()
        engine.passes += 1
        rc = self.calls.decode(triples)
        ms = (time.perf_counter() - t0) * 1000.0
        if rc != 0:
            reason, error = engine.decode_failure(RuntimeError(f"llama_decode returned {rc}"))
            for run, _ in going:
                run.reason, run.error = reason, error
            return None
        rows = self.calls.rows(len(going))
        for i, (run, _) in enumerate(going):
            host = self._host(run)
            host.row = rows[i]
            host.pos = host.n_past + 1
            run.clock.forward_ms, run.clock.forward_tokens = ms, len(going)
            run.threads.after_pass(engine.threads, 0.0)
        single = statistics.median(self._probes[-3:]) if self._probes else None
        return BatchPass(number, len(going), ms, single)

    def _probe(self, run: ReplyRun, token: int) -> None:
        """One sequence's pass at this context length, timed: `token` decoded alone at the
        sequence's position in a scratch sequence holding a copy of its cells."""
        scratch, calls = self.n, self.calls
        calls.copy(self._seq(run), scratch, -1)
        t0 = time.perf_counter()
        rc = calls.decode([(scratch, token, self._host(run).n_past)])
        ms = (time.perf_counter() - t0) * 1000.0
        calls.remove(scratch, 0)
        if rc == 0:
            self._probes.append(ms)

    # ---------------------------------------------------------------- ends ----
    def _end(self, run: ReplyRun) -> Finish:
        """The sequence's Finish; its cells leave the cache (sequence 0 keeps the prompt's)."""
        seq = self._seq(run)
        self.calls.remove(seq, self.prompt if seq == 0 else 0)
        return dataclasses.replace(run.finish(), sequence=seq)

    def _close(self) -> None:
        """The cache as a reply alone leaves it: the prompt, as sequence 0 (Llama's n_tokens)."""
        if self._shared:
            for seq in range(self.n + 1):
                self.calls.remove(seq, self.prompt if seq == 0 else 0)
        self.calls.close()
        self.engine.end_reply()

    @staticmethod
    def _host(run: ReplyRun) -> SequenceHost:
        return cast(SequenceHost, run.host)

    def _seq(self, run: ReplyRun) -> int:
        return self._host(run).seq


#: the run of a request (engine.py's reply in flight)
AnyRun: TypeAlias = "ReplyRun | BatchRun"


def open_run(engine: Any, request: ReplyRequest, live: Any, control: Any) -> AnyRun:
    """The run for a request: a reply alone (n = 1), or N replies in one batch."""
    if request.n == 1:
        return ReplyRun(engine, request, live, control)
    return BatchRun(engine, request, live, control)


__all__ = ["AnyRun", "BatchRun", "SequenceHost", "open_run"]
