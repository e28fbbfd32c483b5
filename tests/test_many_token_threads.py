"""`threads = "auto"`: a pass of many tokens (a prompt's prefill, a pass of several sequences) runs
at the count in force, not at the fewer-thread count that guards it; while a probe runs, at the
fewer of the count the probe measures and the best measured so far, and one thread fewer while a
probe that other programs' CPU started runs (a batch's passes cannot finish it).

The first test runs the real default model with a tuner that has chosen 2 threads over 1 (its
decisions frozen from then on, so that the machine's speed cannot start a probe mid-test): the
prefill, and every pass of a batch of 4 replies, must run at 2 threads, as llama.cpp reports
them and as the steps record them. Before the fix both ran at 1 thread: twice the time to the
first token of a long prompt and 1.5x a batch's passes on an idle 2-core machine."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import llama_cpp
import pytest
from cpu_burners import cpu_burners

from loopchat.engine.auto_threads import AutoThreads
from loopchat.engine.engine import Engine
from loopchat.engine.thread_tuner import ThreadTuner
from loopchat.events import Message, Start, Step
from loopchat.settings import SamplingSettings


def chose_two() -> ThreadTuner:
    """A tuner on 2 cores whose first measurement chose 2 threads (10 ms a pass) over 1 (20 ms)."""
    tuner = ThreadTuner(2)
    while tuner.probing:
        tuner.observe(20.0 if tuner.threads == 1 else 10.0)
    assert tuner.threads == 2 and tuner.safe() == 1  # (1 thread: the guard's count below the one in force)
    return tuner


class Frozen(ThreadTuner):
    """chose_two()'s state, kept: the engine's passes and the others' CPU change nothing, and no
    pass is guarded (on a loaded test worker a pass past the guard's limit was cut, which starts a
    probe that frozen passes never finish: the batch then ran at the probe's fewer count)."""

    def observe(self, ms: float) -> int:
        return self.threads

    def guard_ms(self, floor_ms: float = 50.0) -> float | None:
        return None

    def note_others(self, cores: float) -> None:
        pass


def frozen_two() -> Frozen:
    tuner = chose_two()
    tuner.__class__ = Frozen
    return tuner  # type: ignore[return-value]


def test_a_prefill_and_a_batch_of_sequences_run_at_the_count_in_force(model_path: Path, tmp_path: Path) -> None:
    with Engine(model_path, n_ctx=2048, log_path=tmp_path / "llama.log", thread_tuner=frozen_two()) as engine:
        long_prompt = "Summarize: " + "the quick brown fox jumps over the lazy dog. " * 20
        events = list(engine.generate([Message("user", long_prompt)], SamplingSettings(max_tokens=3, seed=1)))
        start = next(e for e in events if isinstance(e, Start))
        assert start.threads_auto and start.threads == 2  # (the prefill's count: docs/trace-format.md)
        assert llama_cpp.llama_n_threads_batch(engine.llm.ctx) == 2

        settings = SamplingSettings(max_tokens=12, seed=1, temperature=0.8)
        events = list(engine.generate([Message("user", "Name a colour.")], settings, n=4, ignore_eos=True))
        steps = [e for e in events if isinstance(e, Step)]
        assert len({s.sequence for s in steps}) == 4
        batched = [s for s in steps if s.batch is not None]
        assert batched, "no step came from a pass of several sequences"
        assert {s.threads for s in steps} == {2}
        assert llama_cpp.llama_n_threads_batch(engine.llm.ctx) == 2


class Calls:
    """What AutoThreads asks of llama.cpp here: the thread count set."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def set_threads(self, n: int) -> None:
        self.threads.append(n)


def test_while_a_probe_runs_a_many_token_pass_takes_the_fewer_count() -> None:
    tuner = chose_two()
    auto = AutoThreads(Calls(), threading.Event(), lambda: False, tuner)  # type: ignore[arg-type]
    assert auto.prefill_threads() == 2  # the count in force, not the guard's 1
    # other programs' CPU rose by a core: a probe starts, measures the count in force, then 1 thread
    for cores in (0.0, 0.0, 1.0, 1.0):
        tuner.note_others(cores)
    assert tuner.probing and tuner.busier and tuner.threads == 2
    # a pass of many tokens cannot be the probe's measure (a batch's would keep it at 2 for good): one fewer
    assert auto.prefill_threads() == 1
    while tuner.probing and tuner.threads == 2:
        tuner.observe(30.0)
    assert tuner.probing and tuner.threads == 1 and tuner.safe() == 2
    assert auto.prefill_threads() == 1  # the fewer of the probe's count and the best measured
    while tuner.probing:
        tuner.observe(15.0)
    assert tuner.threads == 1 and not tuner.busier and auto.prefill_threads() == 1


@pytest.mark.model
@pytest.mark.alone  # (a CPU-bound process beside it: run by itself)
def test_a_program_started_mid_batch_takes_the_batch_to_fewer_threads(model_path: Path, tmp_path: Path) -> None:
    """A batch of 4 on the real model, auto threads chosen at 2 over 1; once it runs at 2 and
    the tuner has sampled the others' CPU it compares with, a CPU-bound process starts: the others' CPU,
    sampled during the batch, starts a probe, and the batch's next passes run at one thread fewer (its
    passes cannot finish the probe: they would keep the count)."""
    tuner = chose_two()  # (its choice made: a noisy host's load cannot make it 1, with nothing fewer to take)
    with Engine(model_path, n_ctx=4096, log_path=tmp_path / "llama.log", thread_tuner=tuner) as engine:
        chosen = engine.threads
        assert chosen == 2
        settings = SamplingSettings(max_tokens=900, seed=1, temperature=0.8)
        before: list[int] = []
        after: list[int] = []
        burning = False
        with contextlib.ExitStack() as stack:
            for event in engine.generate([Message("user", "Tell a long story.")], settings, n=4, ignore_eos=True):
                if not isinstance(event, Step) or event.sequence != 0:
                    continue
                (after if burning else before).append(event.threads)
                if not burning and event.index >= 10 and tuner.others_base is not None:
                    stack.enter_context(cpu_burners(1))  # (started after the base: a rise from it)
                    burning = True
                if after and after[-1] < chosen:
                    engine.cancel()
    assert set(before) == {chosen}
    assert after and after[-1] == chosen - 1, f"the batch stayed at {chosen} threads beside a CPU-bound process"


def chose_one(two_ms: float) -> ThreadTuner:
    """A tuner on 2 cores whose first measurement chose 1 thread (10 ms a pass) over 2 (`two_ms`),
    then sampled the other programs idle."""
    tuner = ThreadTuner(2)
    while tuner.probing:
        tuner.observe(10.0 if tuner.threads == 1 else two_ms)
    assert tuner.threads == 1
    tuner.note_others(0.05)
    return tuner


def test_where_more_threads_tied_on_single_passes_a_many_token_pass_takes_them() -> None:
    """Single-token passes are memory-bound: 2 threads within `tie` (10%) of 1 is a tie, and a
    pass of many tokens (compute-bound) then runs at 2 while the others are idle; where 2 threads
    were clearly slower (a core another program holds), or the others are busy, at the count in force."""
    tied = chose_one(10.6)
    assert tied.many == 2 and tied.many_threads == 2
    assert AutoThreads(Calls(), threading.Event(), lambda: False, tied).prefill_threads() == 2  # type: ignore[arg-type]
    slower = chose_one(15.0)
    assert slower.many == 1 and slower.many_threads == 1
    assert AutoThreads(Calls(), threading.Event(), lambda: False, slower).prefill_threads() == 1  # type: ignore[arg-type]
    busy = chose_one(10.6)
    busy.note_others(0.9)  # (the first sample after the choice: the base it compares with, no probe)
    assert not busy.probing and busy.many == 2 and busy.many_threads == 1
    unseen = ThreadTuner(2)
    while unseen.probing:
        unseen.observe(10.0 if unseen.threads == 1 else 10.6)
    assert unseen.many == 2 and unseen.many_threads == 1  # (the others not sampled yet: the count in force)


@pytest.mark.model
def test_a_batch_runs_at_the_tied_count_and_single_passes_at_the_chosen_one(model_path: Path, tmp_path: Path) -> None:
    tuner = chose_one(10.6)
    tuner.__class__ = Frozen
    with Engine(model_path, n_ctx=2048, log_path=tmp_path / "llama.log", thread_tuner=tuner) as engine:
        settings = SamplingSettings(max_tokens=10, seed=1, temperature=0.8)
        events = list(engine.generate([Message("user", "Name a colour.")], settings, n=4, ignore_eos=True))
        start = next(e for e in events if isinstance(e, Start))
        steps = [e for e in events if isinstance(e, Step)]
        assert start.threads == 2  # the prefill's count
        assert [s for s in steps if s.batch is not None] and {s.threads for s in steps if s.batch is not None} == {2}
        alone = [e for e in engine.generate([Message("user", "Name a colour.")], settings) if isinstance(e, Step)]
        assert {s.threads for s in alone[1:]} == {1}  # single-token passes: the count chosen
