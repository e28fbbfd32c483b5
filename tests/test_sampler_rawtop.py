"""chain15's two shortcuts on the unsorted distribution (docs/performance.md, "Fifteenth session"):
the draw's walk in one kernel call (sampler_fused.draw_walk) against numpy's draw_unsorted, and the
reported top among a constraint's allowed tokens from the raw top (sampler_rawtop.top_among) against
top_indices over the allowed logits. Each answer is the old one's, or declined (-1, None)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from loopchat.engine import sampler_fused, sampler_ranks, sampler_rawtop
from loopchat.engine.sampler_math import DRAW_BLOCK, draw_unsorted, top_indices

needs_kernel = pytest.mark.skipif(sampler_fused.kernel is None, reason="the C kernel is not built")


def _sums(x: np.ndarray, shift: float, t: float) -> tuple[np.ndarray, float]:
    blocks, norm, _ = sampler_fused.distribution_sums(x, shift, t, DRAW_BLOCK)
    return blocks, norm


@needs_kernel
@pytest.mark.parametrize("n", [1, 7, 1024, 1025, 5000, 250_001])
@pytest.mark.parametrize("t", [1.0, 0.7, 2.0])
def test_draw_walk_is_draw_unsorted(n: int, t: float) -> None:
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    shift = float(x.max())
    blocks, norm = _sums(x, shift, t)
    w = sampler_fused.distribution(x, shift, t, DRAW_BLOCK)[0]
    cum = np.cumsum(blocks)
    # random u, the blocks' running sums themselves and their neighbours (the walk's edges), 0, the end
    us = [*(rng.random(40) * norm), 0.0, norm, norm * 2]
    us += [float(v) for c in cum[:20] for v in (c, np.nextafter(c, 0.0), np.nextafter(c, np.inf))]
    for u in us:
        want = draw_unsorted(None, u, blocks, lambda a, b: sampler_fused.weights_of(x[a:b], shift, t))
        assert sampler_fused.draw_walk(x, shift, t, blocks, DRAW_BLOCK, u) == want, u
        # the stored weights' form
        assert sampler_fused.draw_walk(w, 0.0, 1.0, blocks, DRAW_BLOCK, u) == draw_unsorted(w, u, blocks), u


@needs_kernel
def test_draw_walk_declines_nan() -> None:
    x = np.linspace(-5, 0, 3000).astype(np.float32)
    x[2500] = np.nan
    blocks, norm = _sums(x, 0.0, 1.0)
    assert sampler_fused.draw_walk(x, 0.0, 1.0, blocks, DRAW_BLOCK, 1.0) == -1
    assert sampler_fused.draw_walk(x, 0.0, 1.0, blocks, DRAW_BLOCK, float("nan")) == -1
    with pytest.raises(ValueError):
        sampler_fused.draw_walk(x, 0.0, 1.0, blocks[:-1], DRAW_BLOCK, 1.0)


def _case(rng: np.random.Generator, n: int, forbid: float, ties: bool) -> tuple:
    """A row of logits, its allowed ids (ascending), penalized logits and the changed ids."""
    logits = (rng.standard_normal(n) * 3).astype(np.float32)
    if ties:  # (equal logits among the largest)
        top = np.argsort(-logits)[:60]
        logits[top[rng.integers(0, 60, 6)]] = logits[top[rng.integers(0, 60, 6)]]
    allowed = np.sort(rng.choice(n, int(n * (1 - forbid)), replace=False))
    allowed[0] = int(np.argmax(logits))  # (kept sorted below)
    allowed = np.unique(allowed)
    work = logits.copy()
    changed = [rng.choice(n, int(rng.integers(0, 30)), replace=False)]
    if rng.random() < 0.5:  # the raw top's own tokens penalized, raised or lowered
        changed.append(np.setdiff1d(np.argsort(-logits)[: int(rng.integers(1, 20))], changed[0]))
    for ids in changed:
        work[ids] = logits[ids] + rng.normal(0, 3, ids.shape[0]).astype(np.float32)
    return logits, allowed, work, changed


def _words(allowed: np.ndarray, n: int) -> np.ndarray:
    """The mask of these ids as llguidance gives it: 32 bits a word, bit i & 31 of word i >> 5."""
    bits = np.zeros((n + 31) // 32 * 32, dtype=bool)
    bits[allowed] = True
    return np.packbits(bits, bitorder="little").view(np.int32)


def _among(logits, work, changed, allowed, src, k1, words):  # type: ignore[no-untyped-def]
    c = SimpleNamespace(logits=logits, work=work, changed_ids=list(changed))
    wide = sampler_fused.top_k(logits, sampler_rawtop.wide_k(k1 - 1))
    return None if wide is None else sampler_rawtop.top_among(c, wide, allowed, src, k1, words)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("by_words", [False, True])
def test_top_among_is_top_indices(seed: int, by_words: bool) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.choice([2000, 40_000, 262_144]))
    logits, allowed, work, changed = _case(rng, n, float(rng.choice([0.0, 0.05, 0.5])), seed % 4 == 0)
    src = work[allowed]
    words = _words(allowed, n) if by_words else None
    answered = 0
    for report_k in (1, 10, 40):
        got = _among(logits, work, changed, allowed, src, report_k + 1, words)
        if got is not None:
            answered += 1
            np.testing.assert_array_equal(got, top_indices(src, report_k + 1))
    if sampler_fused.kernel is not None and seed % 4 and n > 2000:
        assert answered  # (the shortcut answers on ordinary rows)


@pytest.mark.parametrize("by_words", [False, True])
def test_top_among_declines(by_words: bool) -> None:
    """Too few candidates above the raw top's last, the raw top's tokens lowered below it, a NaN, and a
    tie at the cut each leave the answer to top_indices."""
    n = 5000
    logits = -np.arange(n, dtype=np.float32) / 100  # (falling: token i is the i-th largest)
    allowed = np.arange(n)
    words = _words(allowed, n) if by_words else None
    c = SimpleNamespace(logits=logits, work=logits, changed_ids=[])
    wide = np.arange(20)
    src = logits.copy()

    def among(work: np.ndarray, changed: list, k1: int) -> np.ndarray | None:
        c.work, c.changed_ids = work, changed
        return sampler_rawtop.top_among(c, wide, allowed, work, k1, words)  # type: ignore[arg-type]

    assert among(src, [], 21) is None  # (21 wanted, 20 above the last)
    np.testing.assert_array_equal(among(src, [], 20), np.arange(20))
    low = src.copy()
    low[:5] -= 10
    assert among(low, [np.arange(5)], 16) is None
    nan = src.copy()
    nan[3] = np.nan
    assert among(nan, [np.array([3])], 5) is None
    tie = src.copy()
    tie[5] = tie[4]
    assert among(tie, [np.array([5])], 5) is None
    raised = src.copy()
    raised[4000] = 5.0  # (a penalty raised a token far below: it leads)
    got = among(raised, [np.array([4000])], 10)
    np.testing.assert_array_equal(got, [4000, *range(9)])


def _top_reference(x: np.ndarray, k: int) -> np.ndarray | None:
    """The kernel's top_k answer by numpy: the k largest, largest first, where the k + 1 largest are
    distinct and there is no NaN; else None."""
    if np.isnan(x).any():
        return None
    order = np.argsort(-x, kind="stable")[: k + 1]
    v = x[order]
    return order[:k] if np.all(v[1:] < v[:-1]) else None


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_halves_are_the_one_pass(threads: int) -> None:
    """top_k, count_greater and take by halves (the helper's where it takes one): the one pass's
    answers, with the largest values in either half, ties across the halves, a NaN in one, and
    the least kept value's sign and count across them (±0)."""
    before = sampler_fused._threads
    sampler_fused.use_threads(threads)
    rng = np.random.default_rng(threads)
    n = 262_144
    try:
        for trial in range(40):
            x = rng.standard_normal(n).astype(np.float32)
            case = trial % 5
            if case == 1:  # the largest two equal, one in each half
                x[10] = x[n - 10] = np.float32(9.0)
            elif case == 2:  # a NaN in the second half
                x[n - 5] = np.nan
            elif case == 3:  # the largest all in the second half
                x[n - 100 :] += 20
            elif case == 4:  # equal values just below the top 41 (no answer's concern) and across halves
                top = np.argsort(-x)[:60]
                x[top[50]] = x[top[45]]
            sampler_fused.chain_starts()
            got = sampler_fused.top_k(x, 40)
            i = int(rng.integers(0, n))
            count = sampler_fused.count_greater(x, i)
            sampler_fused.chain_ends()
            want = _top_reference(x, 40)
            assert (got is None) == (want is None), trial
            if want is not None:
                np.testing.assert_array_equal(got, want)
            assert count == int(np.count_nonzero(x > x[i])), trial
        kernel = sampler_fused.kernel
        assert kernel is not None
        for first_sign in (1.0, -1.0):
            src = np.abs(rng.standard_normal(n).astype(np.float32)) + 1
            kept = np.sort(rng.choice(n, 150_000, replace=False)).astype(np.int64)
            src[kept[10]] = np.float32(0.0 * first_sign)  # the least: ±0 in the first half, ∓0 in the second
            src[kept[140_000]] = np.float32(-0.0 * first_sign)
            src[kept[5]] = np.nan
            ids, out = np.empty(kept.shape[0], np.int64), np.empty(kept.shape[0], np.float32)
            sampler_fused.chain_starts()
            low, n_low = kernel.take(kept, None, src, ids, out)
            sampler_fused.chain_ends()
            np.testing.assert_array_equal(ids, kept)
            np.testing.assert_array_equal(out, src[kept])
            assert low == 0.0 and n_low == 2
            assert np.copysign(1.0, low) == first_sign  # (the first seen, as one loop keeps it)
    finally:
        sampler_fused.use_threads(before)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [31, 1000, 65_600, 262_144, 262_145])
def test_count_pair_is_two_counts(n: int, threads: int) -> None:
    """(Two threads: a long row in two halves, the second on the helper where it is awake.)"""
    before = sampler_fused._threads
    sampler_fused.use_threads(threads)
    try:
        _count_pairs(n)
    finally:
        sampler_fused.use_threads(before)


def _count_pairs(n: int) -> None:
    kernel = sampler_fused.kernel
    assert kernel is not None
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.integers(0, n, 3)] = np.nan
    allowed = np.flatnonzero(rng.random(n) < 0.9)
    words = _words(allowed, n)
    bits = np.zeros(n, dtype=bool)
    bits[allowed] = True
    for i in (0, n - 1, int(rng.integers(0, n))):
        for vw in (float(x[i]), 0.5, -3.0, float("nan")):
            sampler_fused.chain_starts()
            got = kernel.count_pair(x, words, i, vw)
            v32 = np.float32(vw)
            assert got == (int(np.count_nonzero(x > x[i])), int(np.count_nonzero((x > v32) & bits))), (i, vw)


@needs_kernel
def test_count_pair_counts_the_changed_by_their_new_logits() -> None:
    """count_pair given the penalized logits and the changed ids (chain16): the allowed count is the numpy
    steps' (the ids once each, those the mask allows counted by work's logits instead of x's), with ids in two
    arrays, in none, out of the mask, NaNs among the old and new logits; an id out of range is an error."""
    kernel = sampler_fused.kernel
    assert kernel is not None
    rng = np.random.default_rng(16)
    for trial in range(60):
        n = int(rng.choice([40, 1000, 70_000]))
        x = rng.standard_normal(n).astype(np.float32)
        x[rng.integers(0, n, 2)] = np.nan
        allowed = np.flatnonzero(rng.random(n) < rng.choice([0.2, 0.9]))
        words = _words(allowed, n)
        bits = np.zeros(n, dtype=bool)
        bits[allowed] = True
        parts = int(rng.integers(0, 4))
        changed = [rng.choice(n, int(rng.integers(0, min(n, 80))), replace=False) for _ in range(parts)]
        if parts >= 2 and changed[0].size:  # (a token in two arrays: the repeat penalty's and DRY's)
            changed[1] = np.concatenate((changed[1], changed[0][:3]))
        if parts and changed[0].size > 1:  # (a token twice in one array: a logit bias's repeated token)
            changed[0] = np.concatenate((changed[0], changed[0][-1:]))
        work = x.copy()
        for ids in changed:
            work[ids] = x[ids] + rng.normal(0, 2, ids.shape[0]).astype(np.float32)
        if parts and changed[0].size:
            work[changed[0][0]] = np.nan
        i = int(rng.integers(0, n))
        for vw in (float(x[i]), 0.25, float(work[i])):
            v32 = np.float32(vw)
            ids = np.unique(np.concatenate(changed)) if changed else np.empty(0, dtype=np.int64)
            ids = ids[bits[ids]]
            want = int(np.count_nonzero((x > v32) & bits))
            want += int(np.count_nonzero(work[ids] > v32)) - int(np.count_nonzero(x[ids] > v32))
            got = kernel.count_pair(x, words, i, vw, work, changed)
            assert got == (int(np.count_nonzero(x > x[i])), want), (trial, vw)
    x = np.zeros(64, dtype=np.float32)
    with pytest.raises(IndexError):
        kernel.count_pair(x, _words(np.arange(64), 64), 0, 0.0, x.copy(), [np.array([64])])
    with pytest.raises(ValueError):
        kernel.count_pair(x, _words(np.arange(64), 64), 0, 0.0, None, [np.array([3])])


def test_both_ranks_are_the_two_counts() -> None:
    """The raw rank over the model's logits and the sampled rank over the candidates (a prefix of the
    allowed by penalized logit), the penalized tokens counted by their new logits: both_ranks' answer,
    where it gives one, is rank_of's and the count over the candidates'."""
    rng = np.random.default_rng(7)
    answered = 0
    for trial in range(40):
        n = 50_000
        logits, allowed, work, changed = _case(rng, n, 0.2, False)
        src_all = work[allowed]
        keep = np.sort(np.argsort(-src_all, kind="stable")[: int(rng.integers(2000, allowed.shape[0]))])
        ids, source = allowed[keep], src_all[keep]  # (top-p's kind: the largest, in id order)
        changed = list(changed) if trial % 3 else [a.astype(np.int32) for a in changed]  # (int32: widened)
        c = SimpleNamespace(logits=logits, work=work, changed_ids=changed, allowed_words=_words(allowed, n))
        pick = int(rng.integers(0, ids.shape[0]))
        d = SimpleNamespace(ids=ids, probs=None, top=np.array([0]), source=source, shift=float(source.max()), t=2.0)
        token = int(ids[pick])
        got = sampler_ranks.both_ranks(c, d, token, pick, np.array([-1]))  # type: ignore[arg-type]
        if sampler_fused.kernel is None:
            assert got is None
            continue
        if got is not None:
            answered += 1
            assert got == (
                int(np.count_nonzero(logits > logits[token])) + 1,
                int(np.count_nonzero(source > source[pick])) + 1,
            ), trial
    assert answered or sampler_fused.kernel is None
