"""The kernel's long passes on a helper thread (issue 24: the chain's O(vocabulary) passes over
the engine's threads). The raw softmax's sums (numpy's pairwise order, whose top split the helper
takes half of), and exp_sum's, exp_sum_above's and constraint_scan's sums over a row longer
than a part (8,192 tokens) are taken part by part in a fixed order (docs/trace-format.md, "Sums
over the vocabulary"): that order, recomputed here in numpy from the kernel's own exps, gives the
kernel's total bit for bit; and one thread or two (the helper taking parts from the row's end)
give every figure with the same bits, the chain's draws and reports included."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from sampler_paths import built_kernel

from loopchat.engine import sampler_fused
from loopchat.engine.sampler import make_rng, sample
from loopchat.settings import SamplingSettings

PART = 8192
LENGTHS = [8, 8193, 16_384, 16_389, 32_771, 49_152, 262_144, 262_147]


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> Iterator:
    k = built_kernel()
    monkeypatch.setattr(sampler_fused, "kernel", k)
    yield k
    k.set_threads(1, 32_768)
    sampler_fused._threads = 1


def _row(rng: np.random.Generator, n: int) -> np.ndarray:
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    x[rng.integers(0, n, max(n // 50, 1))] = -np.inf
    return x


def _part_order_sum(k, x: np.ndarray, shift: float) -> float:
    """The documented order: each part of 8,192 as eight lanes summed in sequence, lanes
    (0..3) + (4..7), then (l0 + l1) + (l2 + l3); the parts added in order from 0.0; then the
    last n % 8 exps one by one. The exps are the kernel's own (k.exp: the same bits in any lane)."""
    n = x.shape[0]
    e = np.empty(n)
    k.exp(x.astype(np.float64) - shift, e)
    body = n - n % 8
    total = 0.0
    for a in range(0, body, PART):
        lanes = np.cumsum(e[a : min(a + PART, body)].reshape(-1, 8), axis=0)[-1]  # (cumsum: in sequence)
        pair = lanes[:4] + lanes[4:]
        total += float((pair[0] + pair[1]) + (pair[2] + pair[3]))
    for v in e[body:]:
        total += float(v)
    return total


def test_the_sums_follow_the_documented_order_of_parts(kernel) -> None:
    rng = np.random.default_rng(6)
    for n in LENGTHS:
        x = _row(rng, n)
        shift = float(x.max())
        for threads in (1, 2):
            kernel.set_threads(threads, 0)
            want = _part_order_sum(kernel, x, shift)
            assert kernel.exp_sum(x, shift, None) == want, (n, threads)
            # top-p's pass (its total whatever it picks), the tail of n % 8 one by one too
            ids, qs = np.empty(n, np.int64), np.empty(n)
            for v in (-np.inf, float(np.median(x))):
                assert kernel.exp_sum_above(x, shift, v, ids, qs)[0] == want, (n, threads, v)


def _figures(k, x: np.ndarray, shift: float, words: np.ndarray) -> tuple:
    n = x.shape[0]
    q = np.full(n, np.nan)
    ids, qs = np.full(n, -1, np.int64), np.full(n, np.nan)
    total = k.exp_sum(x, shift, q)
    v = float(np.sort(x)[-max(n // 7, 1)])
    above, kept = k.exp_sum_above(x, shift, v, ids, qs)
    work = x.copy()
    work[:: max(n // 40, 1)] -= np.float32(1.5)
    sids, src = np.full(n, -1, np.int64), np.full(n, np.nan, np.float32)
    scan = k.constraint_scan(x, work, words, shift, sids, src)
    count = scan[0]
    raw = np.array([*k.raw_sums(x, shift), *k.raw_sums64(x, shift)])  # (the raw softmax's sums: a -inf, a NaN dot)
    figures = (total, q, above, ids[:kept], qs[:kept], scan, sids[:count], src[:count], raw)
    return (*figures, *_distributions(k, x, shift))


def _distributions(k, x: np.ndarray, shift: float) -> tuple:
    """The distribution's pass over float32 and float64 rows, weights stored or not, at t 1 and 2:
    each one's weights, block sums, norm and sum of w * z."""
    out: list = []
    n = x.shape[0]
    for src, sh in ((x, shift), (x.astype(np.float64) - shift, 0.0)):
        for t in (1.0, 2.0):
            for store in (True, False):
                w = np.full(n, np.nan) if store else None
                blocks = np.full((n + 1023) // 1024, np.nan)
                out += [*k.distribution(src, sh, t, w, blocks, 1024), blocks, w]
    return tuple(out)


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(u, v, equal_nan=True) if isinstance(u, np.ndarray) else u == v or (u != u and v != v)
        for u, v in zip(a, b)
    )


def test_one_thread_or_two_give_the_same_bits(kernel) -> None:
    """Rows of every length class, masks that allow most tokens in runs (a grammar's) or few: the
    exps, sums, picks and the scan's figures are the same bits with the helper thread; and the
    helper does take parts (waited for: a loaded machine may give its thread a core late)."""
    rng = np.random.default_rng(7)
    cases = []
    for n in LENGTHS:
        x = _row(rng, n)
        width = (n + 31) // 32 * 32
        runs = np.repeat(rng.random(width // 16 + 1) < 0.9, 16)[:width]
        for mask in (runs, ~runs):
            cases.append((x, float(x.max()), np.packbits(mask, bitorder="little").view(np.int32)))
    kernel.set_threads(1)
    alone = [_figures(kernel, *c) for c in cases]
    kernel.set_threads(2, 0)
    start, helped = kernel.split_stats()[1], 0
    deadline = time.monotonic() + 20
    while True:
        for case, want in zip(cases, alone):
            assert _same(_figures(kernel, *case), want), case[0].shape[0]
        helped = kernel.split_stats()[1] - start
        if helped > 0 or time.monotonic() > deadline:
            break
    assert helped > 0, "the helper thread never took a part in 20 s"


def test_top_ps_pass_stores_every_exp_as_exp_sum_does(kernel) -> None:
    """exp_sum_above's `full`: every exp of the row stored in the same pass (top-p's flat rows then
    need no second pass, sampler_math._top_p_deep), the same bits as exp_sum's `out`, on one thread
    or two; the total and the deep set's picks as without it."""
    rng = np.random.default_rng(10)
    for n in LENGTHS:
        x = _row(rng, n)
        shift, v = float(x.max()), float(np.sort(x)[-max(n // 30, 1)])
        for threads in (1, 2):
            kernel.set_threads(threads, 0)
            q = np.full(n, np.nan)
            kernel.exp_sum(x, shift, q)
            ids, qs = np.full(n, -1, np.int64), np.full(n, np.nan)
            want = kernel.exp_sum_above(x, shift, v, ids, qs)
            want_picks = (ids[: want[1]].copy(), qs[: want[1]].copy())
            full = np.full(n, np.nan)
            got = kernel.exp_sum_above(x, shift, v, ids, qs, full)
            assert got == want, (n, threads)
            assert np.array_equal(full.view(np.int64), q.view(np.int64)), (n, threads)
            assert np.array_equal(ids[: got[1]], want_picks[0]) and np.array_equal(qs[: got[1]], want_picks[1])


def test_the_distributions_blocks_are_shared_with_the_helper(kernel) -> None:
    """The distribution's pass over a long row (the chain's candidates: ~250,000 under a JSON
    schema on Gemma) is offered to the helper by parts of 8,192: its block sums, norm and sum of
    w * z have the same bits as on one thread (each block summed alone, the blocks added in order),
    its weights are numpy's within the kernel's exp (2 ulp at t 1), and the helper does take
    parts (waited for: a loaded machine may give its thread a core late)."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(262_147) * 3).astype(np.float32)
    shift = float(x.max())
    kernel.set_threads(1)
    alone = _distributions(kernel, x, shift)
    w = np.exp(x.astype(np.float64) - shift)
    assert np.allclose(alone[3], w, rtol=5e-16, atol=0) and abs(alone[0] - w.sum()) <= 1e-12 * w.sum()
    kernel.set_threads(2, 0)
    start, helped = kernel.split_stats()[1], 0
    deadline = time.monotonic() + 20
    while helped == 0 and time.monotonic() < deadline:
        w2 = np.full(x.shape[0], np.nan)
        norm, wz = kernel.distribution(x, shift, 2.0, w2, np.empty(257), 1024)
        helped = kernel.split_stats()[1] - start
        assert (norm, wz) == alone[8:10] and np.array_equal(w2, alone[11])
    assert helped > 0, "the helper thread never took a part of the distribution in 20 s"
    assert _same(_distributions(kernel, x, shift), alone)


def test_the_chain_draws_and_reports_the_same_with_the_helper(kernel) -> None:
    """sample() on rows of Gemma's vocabulary size at settings that run the long passes (top-p
    0.95 over a flat row: top_p_positions's exps and masses): the same token, report and figures."""
    rng = np.random.default_rng(8)
    settings = SamplingSettings().replace(top_k=0, top_p=0.95, min_p=0.0, temperature=2.0, seed=1)
    rows = [(rng.standard_normal(262_144) * s).astype(np.float32) for s in (0.5, 1.0, 2.0)]
    runs = {}
    for threads in (1, 2):
        sampler_fused.use_threads(threads)
        kernel.set_threads(threads, 0)
        out = []
        for row in rows:
            r = sample(row, [1, 2, 3], settings, make_rng(5), 10)
            out.append((r.token_id, r.kept, r.sampled_prob, r.sampled_entropy, r.raw_entropy, r.stages))
        runs[threads] = out
    assert runs[1] == runs[2]
    assert runs[1][0][1] > 1024  # (the unsorted form: top_p_positions's passes over the vocabulary ran)


def _in_child(queue) -> None:  # (a forked child: the kernel module as the parent left it)
    k = built_kernel()
    x = (np.random.default_rng(9).standard_normal(262_144) * 3).astype(np.float32)
    k.set_threads(2, 0)
    queue.put([k.exp_sum(x, float(x.max()), None) for _ in range(20)])


def test_a_forked_child_runs_the_passes_without_its_parents_helper(kernel) -> None:
    """The helper thread does not survive fork(): a child (the engine in a child process) gets
    the same sums, on its own helper or alone, and does not hang on a lock the parent's held."""
    import multiprocessing

    x = (np.random.default_rng(9).standard_normal(262_144) * 3).astype(np.float32)
    kernel.set_threads(2, 0)
    want = [kernel.exp_sum(x, float(x.max()), None) for _ in range(20)]  # (the parent's helper started)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(queue,))
    child.start()
    got = queue.get(timeout=30)
    child.join(timeout=30)
    assert got == want and child.exitcode == 0


def _helper_states() -> list[str]:
    """The scheduler's state letter of the kernel's helper thread ("loopchat-split"): R running or
    runnable (polling), S sleeping; empty while it has not started."""
    from pathlib import Path

    states = []
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == "loopchat-split":
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except OSError:  # (a thread that ended meanwhile)
            continue
    return states


def _until(want: str, seconds: float = 10.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while (states := _helper_states()) != [want] and time.monotonic() < deadline:
        time.sleep(0.005)
    return states


def test_a_chain_start_wakes_the_helper_and_its_end_lets_it_sleep(kernel) -> None:
    """wake(us) (sampler_fused.chain_starts, at sample()'s start) wakes the sleeping helper before
    the chain's first long pass and keeps it polling; wake(0) (chain_ends) lets it sleep again after
    its short poll, so it does not spin through the next forward pass. sample() leaves it asleep."""
    x = (np.random.default_rng(10).standard_normal(262_144) * 3).astype(np.float32)
    kernel.set_threads(2, 0)
    kernel.exp_sum(x, float(x.max()), None)  # (the helper started)
    assert _until("S") == ["S"], "the helper does not sleep after its poll"
    if kernel.split_stats()[2]:  # a part waited for without a core (a loaded machine), in this test or
        time.sleep(1.1)  # an earlier one: wake() does nothing for the kernel's back-off, 1 s at most (split_backoff)
    kernel.wake(30_000_000)  # (30 s: the assertions below, not the hold, end its poll)
    assert _until("R") == ["R"], "wake() did not wake the sleeping helper"
    time.sleep(0.05)
    assert _helper_states() == ["R"], "the helper slept before its hold ended"
    kernel.wake(0)
    assert _until("S") == ["S"], "the helper still polls after wake(0)"
    sampler_fused.use_threads(2)
    settings = SamplingSettings().replace(top_k=0, top_p=0.95, min_p=0.0, temperature=2.0, seed=1)
    sample(x, [1, 2, 3], settings, make_rng(5), 10)
    assert _until("S") == ["S"], "the helper still polls after sample()"


def test_a_chain_end_times_the_helpers_wake_to_the_next_chain(kernel) -> None:
    """wake(0) (a chain's end) sets the sleeping helper's own timer a little before the next chain
    should start, as far from this end as the last chain's start was from the end before it (the
    forward pass between them): the helper sleeps through most of that gap, then polls, and the next
    chain's start finds it awake and sends no wake-up (split_stats()[3], the starts that found it
    asleep; [4], the timed wakes). set_ahead(False): every start after a gap finds it asleep."""
    x = (np.random.default_rng(11).standard_normal(262_144) * 3).astype(np.float32)
    kernel.set_threads(2, 0)
    kernel.exp_sum(x, float(x.max()), None)  # (the helper started)
    if kernel.split_stats()[2]:  # (the back-off after a wait on a loaded machine: wake() does nothing for <= 1 s)
        time.sleep(1.1)

    def chain_after(gap_s: float) -> tuple[int, int]:
        """A chain started gap_s after the last one's end (and ended): (its start's signals, the timed wakes)."""
        before = kernel.split_stats()
        deadline = time.monotonic() + gap_s
        while time.monotonic() < deadline:  # (the "forward pass": busy, as llama.cpp's threads are)
            pass
        kernel.wake(5000)
        kernel.exp_sum(x, float(x.max()), None)
        kernel.wake(0)
        after = kernel.split_stats()
        return after[3] - before[3], after[4] - before[4]

    assert kernel.set_ahead(True) is not None
    # (the first measures the gap; on a loaded machine the helper may not get a core before a start,
    # or a wait without a core backs the wakes off for up to 1 s: chains until one start finds it woken by
    # its timer, 30 s at most)
    results = [chain_after(0.02)]
    deadline = time.monotonic() + 30.0
    while (0, 1) not in results[1:] and time.monotonic() < deadline:
        results.append(chain_after(0.02))
    assert (0, 1) in results[1:], results[-16:]
    assert _until("S") == ["S"], "the helper does not sleep after its timed poll"
    try:
        kernel.set_ahead(False)
        results = [chain_after(0.02) for _ in range(4)]
        deadline = time.monotonic() + 30.0  # (asleep at a start after a gap: a start signals it; not
        while not any(signals for signals, _ in results) and time.monotonic() < deadline:  # in a back-off)
            results.append(chain_after(0.02))
        assert all(timed == 0 for _, timed in results), results
        assert any(signals for signals, _ in results), results[-16:]
    finally:
        kernel.set_ahead(True)


def test_a_stall_alone_leaves_the_helper_out_briefly_and_repeated_ones_up_to_a_second(kernel) -> None:
    """After a wait of more than 0.1 ms for a part the helper had taken (its thread lost its core),
    no job is offered for a while: 20 ms (about one of Gemma's passes) after a stall that came alone,
    twice the last back-off after one within four back-offs of the last (a machine that stays
    loaded), never more than a second; a quiet stretch starts again from 20 ms. Before, every stall
    cost a second (some 60 passes of Gemma without the helper: the chain ~1.4x, docs/performance.md,
    "The helper's back-off")."""
    ms = 1_000_000
    assert kernel.split_backoff(-1, 20 * ms) == 20 * ms  # the first
    assert kernel.split_backoff(5_000 * ms, 1_000 * ms) == 20 * ms  # one after a quiet stretch
    assert kernel.split_backoff(80 * ms, 20 * ms) == 20 * ms  # four back-offs after the last: alone
    # a loaded machine: each stall right after the back-off before it ended
    backoffs, last = [], 20 * ms
    for _ in range(9):
        last = kernel.split_backoff(last + ms, last)
        backoffs.append(last // ms)
    assert backoffs == [40, 80, 160, 320, 640, 1000, 1000, 1000, 1000]
    assert kernel.split_backoff(3_999 * ms, 1_000 * ms) == 1_000 * ms
    assert kernel.split_backoff(4_000 * ms, 1_000 * ms) == 20 * ms
