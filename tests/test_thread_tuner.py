"""The auto thread count's decisions, fed forward-pass times of a simulated machine.

(The engine on the real model, with a real CPU-bound process started beside it, is in
test_auto_threads.py.)"""

from __future__ import annotations

import re

import pytest

from loopchat.engine.thread_tuner import ThreadTuner
from loopchat.threads_setting import AUTO, parse_threads

QUIET = {1: 17.0, 2: 10.0}  # ms a pass: 2 threads win on an idle 2-core machine
BUSY = {1: 20.0, 2: 50.0}  # one other CPU-bound program: 2 threads wait for each other


def run(tuner: ThreadTuner, machine: dict[int, float], passes: int, trail: list[int] | None = None) -> list[int]:
    """Feed `passes` passes whose time depends on the count in force; the counts used."""
    used = [] if trail is None else trail
    for _ in range(passes):
        n = tuner.threads
        used.append(n)
        tuner.observe(machine[n])
    return used


def test_quiet_machine_keeps_all_cores() -> None:
    t = ThreadTuner(2)
    # the first measurement starts with 1 thread: the safe reference on a busy machine
    assert t.threads == 1 and t.reason == "1 thread until measured"
    used = run(t, QUIET, 40)
    assert not t.probing and t.threads == 2
    assert used[:4] == [1] * 4 and used[4:10] == [2] * 6  # 1 thread, then all the cores
    assert set(used[10:]) == {2}
    assert t.reason == "chose 2 threads: 10.0 ms/pass vs 1: 17.0 ms (first measurement)"


def test_busy_machine_chooses_fewer_threads() -> None:
    t = ThreadTuner(2)
    used = run(t, BUSY, 30)
    # 4 passes at 1 thread; at 2, a warm-up pass and one more (cut there: more than
    # twice as slow), then 1 again
    assert t.threads == 1 and used[:7] == [1, 1, 1, 1, 2, 2, 1] and set(used[6:]) == {1}
    assert t.reason.startswith("chose 1 thread: 20.0 ms/pass vs 2: 50.0 ms")


def test_drift_then_regular_recheck_follow_the_machine() -> None:
    t = ThreadTuner(2, recheck_ms=1000.0)
    run(t, QUIET, 30)
    assert t.threads == 2
    # another program starts: 2-thread passes get 5x slower; the watch window sees it
    used = run(t, BUSY, 30)
    assert t.threads == 1 and used[-1] == 1
    assert "slower than when chosen" in t.reason
    # it stops: 1 thread is no faster, so only the regular re-check finds 2 again (the
    # time 2 threads lost before they were left counts as a cost: it comes after ~12 s)
    run(t, QUIET, 1000)
    assert t.threads == 2 and "regular re-check" in t.reason


def test_recheck_backs_off_when_probing_costs_much() -> None:
    t = ThreadTuner(2, recheck_ms=1000.0, budget=0.02)
    machine = {1: 20.0, 2: 2000.0}  # one 2-thread pass costs 100 one-thread passes
    used = run(t, machine, 15_000)
    probes = [i for i in range(1, len(used)) if used[i] == 2 and used[i - 1] == 1]
    assert len(probes) >= 2
    # each probe of 2 threads is cut after its first pass, and re-checks are spaced so
    # that they cost at most ~2% of the time: ~5000 passes apart, not every 50
    assert all(b - a >= 4000 for a, b in zip(probes, probes[1:]))
    assert re.search(r"; re-check after \d+ s$", t.reason)
    spent_probing = sum(machine[n] for n in used[probes[0] :]) - 20.0 * len(used[probes[0] :])
    assert spent_probing / (20.0 * len(used[probes[0] :])) < 0.12


def test_hill_climb_on_many_cores() -> None:
    # 8 cores, 2 of them taken by other programs: 6 threads is fastest; with 7 or 8 the
    # threads wait at every barrier for one the OS has descheduled
    machine = {n: 60.0 / n for n in range(1, 7)} | {7: 60.0, 8: 80.0}
    t = ThreadTuner(8)
    used = run(t, machine, 80)
    assert t.threads == 6 and used[-1] == 6
    assert 5 in used and 7 in used  # it looked on both sides of the best
    # 1 thread, then 8, then walking up from 1 (the faster): 8 counts measured in all
    assert used.index(6) < 45 and set(used) == set(range(1, 9))


def test_noise_within_the_margin_changes_nothing() -> None:
    t = ThreadTuner(2, margin=0.05)
    run(t, {1: 10.3, 2: 10.0}, 20)
    assert t.threads == 2
    t = ThreadTuner(2, margin=0.05)
    run(t, {1: 9.8, 2: 10.0}, 20)  # 2% faster than all the cores is not enough to choose it
    assert t.threads == 2 and t.reason.startswith("chose 2 threads: 10.0 ms/pass vs 1: 9.8 ms")


def test_one_core_never_probes() -> None:
    t = ThreadTuner(1)
    assert set(run(t, {1: 10.0}, 50)) == {1}
    assert not t.probing and t.changes == 0 and "one physical core" in t.reason


def test_a_new_reason_bumps_changes() -> None:
    t = ThreadTuner(2)
    seen = {t.changes}
    for _ in range(20):
        t.observe(QUIET[t.threads])
        seen.add(t.changes)
    assert len(seen) >= 3  # probing 1, then kept 2


@pytest.mark.parametrize(("value", "expected"), [("auto", AUTO), ("AUTO", AUTO), ("3", 3), (2, 2)])
def test_parse_threads(value: object, expected: object) -> None:
    assert parse_threads(value) == expected


@pytest.mark.parametrize("value", ["0", "-1", "two", "", 0, True, 1.5])
def test_parse_threads_rejects(value: object) -> None:
    with pytest.raises(ValueError, match='"auto" or a whole number'):
        parse_threads(value)


def test_others_cpu_use_changing_starts_a_probe_at_once() -> None:
    t = ThreadTuner(2, recheck_ms=10_000.0, max_recheck_ms=120_000.0)
    run(t, {1: 20.0, 2: 2000.0}, 20)  # a busy machine: 1 thread, re-checks backed off
    assert t.threads == 1 and "re-check after 99 s" in t.reason
    t.note_others(0.4)  # the first sample after a choice may span the probe: skipped
    t.note_others(1.2)  # the reference
    t.note_others(0.1)  # one sample is not enough (a build between two steps)
    t.note_others(1.0)
    assert not t.probing
    t.note_others(0.0)
    t.note_others(0.1)  # the other program has stopped: probe now, not in 2 minutes
    assert t.probing
    run(t, QUIET, 20)
    assert t.threads == 2
    # (1 thread's figure: the passes watched before the probe)
    assert (
        t.reason == "chose 2 threads: 10.0 ms/pass vs 1: 20.0 ms (other programs' CPU use went from 1.2 to 0.1 cores)"
    )


@pytest.mark.slow
@pytest.mark.alone  # a CPU burner: not beside another test worker
def test_other_cpu_meter_sees_a_cpu_bound_process() -> None:
    import time

    from cpu_burners import cpu_burners

    from loopchat.engine.thread_tuner import OtherCpuMeter

    meter = OtherCpuMeter()
    with cpu_burners(1, seconds=30):
        meter.sample()
        time.sleep(1.0)  # the measured interval itself (nothing to await: CPU time accrues)
        busy = meter.sample()
    assert busy >= 0.6, busy  # about one core (a shared machine may add, never remove)


def test_a_count_with_rare_long_stalls_is_judged_by_what_it_cost() -> None:
    """Beside two CPU-bound programs: 2 threads run most passes faster than 1, but one in
    50 stalls for 1.2 s. Short probes miss the stalls; the passes lived at 2 threads
    don't, and auto ends up as fast as 1 thread pinned (within 10%)."""
    t = ThreadTuner(2, recheck_ms=10_000.0)
    at_two = 0
    total = 0.0
    one = [30.0, 40.0, 26.0, 34.0]  # 1 thread's passes vary (3 runnable on 2 cores)
    for i in range(3000):
        n = t.threads
        if n == 2:
            at_two += 1
            ms = 1200.0 if at_two % 50 == 0 else 25.0
        else:
            ms = one[i % 4]
        total += ms
        t.observe(ms)
    pinned_one = 3000 * sum(one) / 4  # 32.5 ms a pass
    assert total <= 1.1 * pinned_one, (total / pinned_one, at_two)


def test_spells_of_slow_passes_do_not_send_it_back_to_a_count_that_stalls() -> None:
    """1 thread's passes come in slow and fast spells (3 runnable threads on 2 cores):
    each slow spell starts a probe; 2 threads run fast in a short probe but stall once in
    40 passes. What the passes at 2 threads cost is remembered (not re-run at each
    spell) and leaving them counts as a probe's cost: auto stays within 3% of 1 thread
    pinned (without that memory: 1.35x slower)."""
    t = ThreadTuner(2, recheck_ms=10_000.0)
    at_two = ones = 0
    total = 0.0
    for _ in range(3000):
        if t.threads == 2:
            at_two += 1
            ms = 1200.0 if at_two % 40 == 0 else 25.0
        else:
            ones += 1
            ms = 24.0 if (ones // 20) % 2 == 0 else 40.0
        total += ms
        t.observe(ms)
    assert total <= 1.03 * 3000 * 32.0, (total / (3000 * 32.0), at_two)


def test_a_probe_pass_is_guarded_and_a_cut_keeps_the_safe_count() -> None:
    t = ThreadTuner(2)
    assert t.guard_ms() is None  # 1 thread first: nothing measured to guard against yet
    run(t, {1: 20.0}, 4)
    assert t.threads == 2 and t.probing
    # bound max(4 x 20, 50) = 80 ms for the pass and its redo at 1 thread: cut at 60
    assert t.guard_ms() == 60.0 and t.safe() == 1
    assert t.cut(63.0) == 1  # redo at 1 thread
    assert not t.probing and t.threads == 1
    assert t.reason == "chose 1 thread: 20.0 ms/pass vs 2: cut at 63.0 ms (first measurement)"
    # the count in force is not guarded; the next probe of 2 threads is, against the
    # 1-thread passes just watched (here 5 ms: the 50 ms floor applies)
    assert t.guard_ms() is None
    run(t, {1: 5.0}, 8)
    assert t.probing and "faster than when chosen" in t.reason
    assert t.threads == 2 and t.guard_ms() == 45.0


def test_a_cut_time_never_wins_even_when_short() -> None:
    # a cut pass's time is a lower bound: even one shorter than the safe count's mean
    # (a guard set very short) does not make the cut count the choice
    t = ThreadTuner(2)
    run(t, {1: 20.0}, 4)
    assert t.cut(5.0) == 1 and t.threads == 1 and "2: cut at 5.0 ms" in t.reason


def test_the_count_in_force_is_guarded_against_the_fewer_threads_measured() -> None:
    t = ThreadTuner(2)
    run(t, QUIET, 20)
    assert t.threads == 2 and not t.probing
    # 2 threads in force, 1 thread measured at 17 ms: a pass may take max(68, 50) - 17
    assert t.safe() == 1 and t.guard_ms() == 51.0
    # a hiccup: one pass cut; redone at 1 thread, then 2 threads measured again (guarded)
    assert t.cut(52.0) == 1
    assert t.probing and t.threads == 2 and t.guard_ms() == 51.0  # the warm-up pass
    run(t, QUIET, 6)
    assert not t.probing and t.threads == 2
    assert t.reason == "kept 2 threads: 10.0 ms/pass vs 1: 17.0 ms (a pass at 2 threads ran past 52.0 ms)"
    # a lasting stall: cut again when measured (a measured pass past 2x the best: 34 ms)
    assert t.cut(52.0) == 1
    run(t, {2: 10.0}, 1)  # the warm-up
    assert t.guard_ms() == 34.0
    assert t.cut(35.0) == 1 and not t.probing and t.threads == 1
    assert t.reason.startswith("chose 1 thread: 17.0 ms/pass vs 2: cut at 35.0 ms")
    assert t.guard_ms() is None  # 1 thread: nothing fewer to fall back on


def test_busier_at_one_thread_starts_no_probe() -> None:
    """At 1 thread, passes getting slower or others' CPU use rising say the machine got
    busier: only fewer threads could help, and there are none, so no probe of more
    threads (beside other work one such pass took seconds). Faster again: a probe."""
    t = ThreadTuner(2)
    run(t, BUSY, 20)
    assert t.threads == 1 and not t.probing
    run(t, {1: 45.0}, 30)  # 2.2x slower than when chosen
    assert not t.probing and t.threads == 1
    t.note_others(0.5)  # (skipped: may span the probe)
    t.note_others(1.0)  # the reference
    t.note_others(1.8)
    t.note_others(1.9)
    assert not t.probing
    run(t, {1: 20.0}, 8)  # faster than the 45 ms it got used to: the load went
    assert t.probing and "faster than when chosen" in t.reason
