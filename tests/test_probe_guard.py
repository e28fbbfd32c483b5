"""The auto thread count's probes are bounded (issue 22): a probe's pass at a count not
yet measured that runs past its bound is ended through llama.cpp's abort callback and
redone at the safe count; the step records the cut, and the reply is the very reply a
pass that was never cut would give.

Real model, real engine; the competing process is a real CPU-bound process. Assertions
are on what the steps record, never on an absolute speed."""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path

import pytest
from cpu_burners import cpu_burners

from loopchat.engine.cores import physical_cores
from loopchat.engine.engine import Engine
from loopchat.engine.probe_guard import PassGuard
from loopchat.engine.thread_tuner import ThreadTuner
from loopchat.events import Finish, FinishReason, Message, Step
from loopchat.settings import SamplingSettings

pytestmark = pytest.mark.model

MESSAGES = [Message("user", "Tell me a long story about a lighthouse keeper.")]
SETTINGS = SamplingSettings(seed=7, temperature=0.9, max_tokens=160)


class CutEveryProbe(ThreadTuner):
    """A tuner whose guard ends every probe pass at once (0.01 ms): every count but the
    safe one is cut, whatever the machine is doing."""

    def guard_ms(self, floor_ms: float = 50.0) -> float | None:
        return None if super().guard_ms(floor_ms) is None else 0.01


def steps_of(engine: Engine, settings: SamplingSettings = SETTINGS) -> tuple[list[Step], Finish]:
    events = list(engine.generate(MESSAGES, settings, ignore_eos=True))
    return [e for e in events if isinstance(e, Step)], events[-1]


def test_a_cut_probe_pass_is_redone_and_the_reply_is_bit_identical(model_path: Path, tmp_path: Path) -> None:
    if physical_cores() < 2:
        pytest.skip("one physical core: auto never probes another count")
    log = tmp_path / "llama.log"
    with Engine(model_path, n_ctx=1024, threads=1, log_path=log) as fixed:
        want, _ = steps_of(fixed)
    # re-checks every 40 ms of passes: a 160-token reply meets many probes, each cut
    tuner = CutEveryProbe(physical_cores(), recheck_ms=40.0, max_recheck_ms=40.0)
    with Engine(model_path, n_ctx=1024, log_path=log, thread_tuner=tuner) as auto:
        assert "cut at" in tuner.reason  # the first measurement, at load, cut its probe too
        passes = auto.passes
        got, finish = steps_of(auto)
        assert auto.passes - passes == len(got)  # a cut and its redo count as one pass
    cut = [s for s in got if s.probe_cut_ms > 0]
    assert len(cut) >= 3, "the re-checks should have probed (and cut) several times"
    assert all(s.threads == 1 and 0 < s.probe_cut_ms <= s.forward_ms for s in cut), [
        (s.index, s.threads, s.probe_cut_ms, s.forward_ms, s.threads_reason)
        for s in cut
        if not (s.threads == 1 and 0 < s.probe_cut_ms <= s.forward_ms)
    ]
    assert all(s.probe_cut_ms == 0 for s in want)
    assert any("cut at" in s.threads_reason for s in got)
    assert finish.reason == FinishReason.LENGTH
    # the same tokens, and the same numbers from the same logits, bit for bit
    fields = (
        "token_id",
        "raw_top",
        "sampled_top",
        "raw_prob",
        "sampled_prob",
        "raw_entropy",
        "sampled_entropy",
        "candidates_kept",
        "n_past",
        "threads",
    )
    assert [[getattr(s, f) for f in fields] for s in got] == [[getattr(s, f) for f in fields] for s in want]


@pytest.mark.alone  # CPU burners beside it: not beside another test worker
def test_beside_a_cpu_bound_process_no_probe_pass_stalls_the_reply(model_path: Path, tmp_path: Path) -> None:
    cores = physical_cores()
    if cores < 2:
        pytest.skip("one physical core: auto never probes another count")
    # frequent re-checks (every 0.3 s of passes, backing off to 0.6 s at most), so that a
    # 300-token reply meets several probes of all the cores beside the process
    tuner = ThreadTuner(cores, recheck_ms=300.0, max_recheck_ms=600.0)
    usable = len(os.sched_getaffinity(0))
    with cpu_burners(max(1, usable - 1), seconds=120):
        with Engine(model_path, n_ctx=1024, log_path=tmp_path / "llama.log", thread_tuner=tuner) as eng:
            steps, finish = steps_of(eng, SamplingSettings(seed=3, temperature=0.9, max_tokens=300))
    assert finish.reason == FinishReason.LENGTH
    one = [s.forward_ms for s in steps[1:] if s.threads == 1 and not s.probe_cut_ms]
    assert len(one) > len(steps) // 2, "beside a CPU-bound process auto should mostly run 1 thread"
    ref = statistics.median(one)
    probing = [s for s in steps[1:] if s.probe_cut_ms or s.threads == cores]
    assert probing, "no probe of all the cores was recorded"
    assert any(s.probe_cut_ms for s in steps), "no probe pass ran past its bound (without the guard they take seconds)"
    # each probe pass is bounded relative to the 1-thread passes of the same reply: the
    # guard's bound is max(4x, 50 ms) with the redo; the rest is slack for a busy machine
    worst = max(s.forward_ms for s in probing)
    assert worst <= max(10 * ref, 150.0), f"a probe pass took {worst:.0f} ms against {ref:.1f} ms at 1 thread"


class Flag:
    def __init__(self) -> None:
        self.on = threading.Event()

    def set(self) -> None:
        self.on.set()

    def clear(self) -> None:
        self.on.clear()


@pytest.mark.parametrize("cancelled", [False, True])
def test_the_guard_composes_with_a_cancel(cancelled: bool) -> None:
    """The guard sets the shared abort flag at its deadline; when the pass returns it
    clears it again, unless a cancel (Esc) came meanwhile: that cancel must not be lost."""
    flag = Flag()
    guard = PassGuard(flag, lambda: cancelled)
    try:
        guard.arm(1.0)
        assert flag.on.wait(10), "the guard never fired"
        assert guard.disarm() is True
        assert flag.on.is_set() is cancelled
        # a pass that returns before its deadline: nothing fired, nothing touched
        flag.clear()
        guard.arm(60_000.0)
        time.sleep(0.01)
        assert guard.disarm() is False and not flag.on.is_set()
    finally:
        guard.close()
