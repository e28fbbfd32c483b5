"""The k largest of a row in one kernel pass (`top_k`, sampler_fused.top_k): numpy's one answer
where there is one (no two of the k + 1 largest equal, no NaN), and no answer elsewhere, on long
rows made to break it (ties, -inf, a NaN, masks that allow most or few positions); top_indices
and top-k by the constraint's mask the same on both paths; the constraint's scan asked to write
no ids (a top-k by the mask follows: Candidates.defer_ids) gives the same figures."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from sampler_paths import built_kernel

from loopchat.engine import sampler_fused
from loopchat.engine.sampler_candidates import Candidates
from loopchat.engine.sampler_math import top_indices


def _rows(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    inf = x.copy()
    inf[rng.integers(0, n, n // 10 + 1)] = -np.inf
    nan = x.copy()
    nan[rng.integers(0, n)] = np.nan
    rising = np.linspace(-50, 50, n, dtype=np.float32)  # (the heap's worst order: every value enters)
    # (a long row's pass by its blocks' maxima: the largest values crowded into one block and its
    # neighbour, and a row of -inf but for a few values, whose blocks give no floor)
    cluster = x.copy()
    at = int(rng.integers(0, max(n - 100, 1)))
    cluster[at : at + 100] = 100 + rng.permutation(min(100, n - at)).astype(np.float32)
    sparse = np.full(n, -np.inf, dtype=np.float32)
    sparse[rng.choice(n, min(30, n), replace=False)] = rng.standard_normal(min(30, n)).astype(np.float32)
    rows = {"normal": x, "-inf": inf, "ties": np.round(x * 2).astype(np.float32), "nan": nan, "rising": rising}
    return {**rows, "cluster": cluster, "sparse": sparse}


@pytest.mark.parametrize("threads", [1, 2])
def test_top_k_is_numpys_one_answer_over_long_rows(threads: int) -> None:
    """(Two threads: a long row's blocks' maxima in two halves, the second on the helper where it is awake.)"""
    k = built_kernel()
    k.set_threads(threads)
    try:
        _top_k_rows(k)
    finally:
        k.set_threads(1)


def _top_k_rows(k) -> None:  # noqa: ANN001
    rng = np.random.default_rng(24)
    answered = 0
    for n in (9, 41, 4097, 16_385, 49_159, 65_600, 262_147):  # (from 16,384 by blocks: a short last one)
        for name, x in _rows(rng, n).items():
            for allowed in (None, 0.97, 0.05):
                mask = None if allowed is None else rng.random(n) < allowed
                pos = np.arange(n) if mask is None else np.flatnonzero(mask)
                order = pos[np.lexsort((pos, -x[pos]))]  # (largest first, equal ones by position)
                for want in (1, 10, 40, 96, 256, 257):
                    out = np.full(want, -1, dtype=np.int64)
                    k.wake(5000)  # (the helper polling: it takes the second half where it gets there first)
                    got = k.top_k(x, None if mask is None else mask.view(np.uint8), out)
                    top = x[order[: want + 1]]
                    one = order.shape[0] > want and want <= 256 and not np.isnan(x).any()
                    one = one and bool(np.all(top[:-1] > top[1:]))
                    assert got == one, (n, name, allowed, want)
                    if got:
                        assert np.array_equal(out, order[:want]), (n, name, allowed, want)
                        answered += 1
    assert answered > 50


@pytest.mark.parametrize("n", [4097, 49_152, 262_144])
def test_top_indices_and_the_masked_top_k_are_the_same_on_both_paths(n: int, monkeypatch) -> None:
    """What top_indices gave before the kernel's pass (numpy's search), whatever the row; the
    masked top-k of the candidates (a constraint's mask, top-k after it) the same."""
    rng = np.random.default_rng(n)
    for name, x in _rows(rng, n).items():
        if name == "nan":
            continue
        mask = rng.random(n) < 0.9
        got = []
        for path in (built_kernel(), None):
            monkeypatch.setattr(sampler_fused, "kernel", path)
            c = Candidates(x, [], float(x.max()), 1.0, top_indices(x, 10), 10)
            c.allowed = mask
            c.defer_ids(int(mask.sum()), functools.partial(np.flatnonzero, mask))
            c.take_top(40)
            got.append((top_indices(x, 40).tolist(), top_indices(x, 257).tolist(), c.ids.tolist()))
        assert got[0] == got[1], (n, name)


def test_the_scan_asked_for_no_ids_gives_the_same_figures_and_writes_none() -> None:
    k = built_kernel()
    rng = np.random.default_rng(3)
    n = 262_144
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    work = x.copy()
    work[rng.integers(0, n, 40)] -= np.float32(1.5)
    mask = np.repeat(rng.random(n // 64) < 0.95, 64)  # (runs, as a grammar's mask)
    words = np.packbits(mask, bitorder="little").view(np.int32)
    ids, src = np.full(n, -5, dtype=np.int64), np.full(n, np.nan, dtype=np.float32)
    with_ids = k.constraint_scan(x, work, words, float(x.max()), ids, src)
    src_after = src.copy()
    src[:] = np.nan
    assert k.constraint_scan(x, work, words, float(x.max()), None, src)[:5] == with_ids[:5]
    assert np.isnan(src).all() and np.array_equal(ids[: with_ids[0]], np.flatnonzero(mask))
    assert np.array_equal(src_after[: with_ids[0]], work[mask])


def test_deferred_ids_are_made_only_when_read() -> None:
    x = np.arange(10, dtype=np.float32)
    c = Candidates(x, [], 9.0, 1.0, np.array([9]), 1)
    made = []
    c.defer_ids(4, lambda: made.append(1) or np.array([1, 3, 5, 7]))
    assert c.count == 4 and not made
    assert c.ids.tolist() == [1, 3, 5, 7] and made == [1] and c.count == 4
    c.ids = None
    assert c.count == 10


@pytest.mark.parametrize("fused", [False, True])
def test_a_flat_rows_top_p_does_not_search_its_head(monkeypatch, fused: bool) -> None:
    """Top-p 0.95 over a flat row of 49,152 (thousands kept, a total mass within the head's reach):
    the deep set's tokens above the head's threshold hold less than the target, so the head's cut is
    not searched (it would not be found), and the kept set is the sort's; a sharp row's is still
    found in the head. Both by the Python steps (`fused` off) and the kernel's one call (top_p_deep:
    its answer says where the search ended)."""
    from loopchat.engine import sampler_math

    calls = []
    head_cut, one_call = sampler_math._head_cut, sampler_fused.top_p_deep
    monkeypatch.setattr(sampler_math, "_head_cut", lambda *a: calls.append(1) or head_cut(*a))

    def top_p_deep(*a):  # type: ignore[no-untyped-def]
        out = one_call(*a) if fused else None
        if out is not None and out[0] == "head":
            calls.append(1)
        return out

    monkeypatch.setattr(sampler_fused, "top_p_deep", top_p_deep)
    for scale, searched in ((3.0, False), (12.0, True)):  # (3.0: ~4,000 kept, the target ~3.8 in the head's reach)
        x = (np.random.default_rng(9).standard_normal(49_152) * scale).astype(np.float32)
        calls.clear()
        kept, _share = sampler_math.top_p_positions(x, None, 0.95)
        w = np.exp(x.astype(np.float64) - float(x.max()))
        order = np.lexsort((np.arange(x.shape[0]), -x))
        n_keep = int(np.searchsorted(np.cumsum(w[order]), 0.95 * w.sum(), side="left")) + 1
        assert sorted(kept.tolist()) == sorted(order[:n_keep].tolist()), scale
        assert bool(calls) == searched, (scale, len(kept))


def test_the_kernels_sort_is_numpys_stable_argsort(monkeypatch) -> None:
    """sort_down (Candidates.sort's one call) gives the ids in np.argsort(-work[ids], kind="stable")'s order
    and their float64 logits, bit for bit: ties (0.0 beside -0.0 too) in the order they come, NaN last,
    infinities, a run of one, runs across the insertion sort's 16 and the stack's 1,024; and Candidates.sort
    on both paths gives the same candidates."""
    built_kernel()
    rng = np.random.default_rng(44)
    for n_ids in (0, 1, 2, 15, 16, 17, 67, 1024, 1025, 3000):
        for name, row in _rows(rng, 5000).items():
            row = row.copy()
            row[rng.integers(0, 5000, 40)] = rng.choice(np.array([0.0, -0.0, np.inf], dtype=np.float32), 40)
            ids = rng.choice(5000, size=n_ids, replace=False).astype(np.int64)
            want = ids[np.argsort(-row[ids], kind="stable")]
            got = sampler_fused.sort_down(row, ids)
            assert got is not None
            assert np.array_equal(got[0], want), (name, n_ids)
            assert got[1].tobytes() == row[want].astype(np.float64).tobytes(), (name, n_ids)
    row = _rows(rng, 5000)["ties"]
    sorted_ids = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(sampler_fused, "sort_down", lambda work, ids: None)
        c = Candidates(row, [], float(row.max()), 1.0, top_indices(row, 10), 10)
        c.ids = np.arange(0, 5000, 7, dtype=np.int64)
        c.sort()
        assert c.sorted and c.logits64 is not None
        sorted_ids.append((c.ids.tobytes(), c.logits64.tobytes()))
    assert sorted_ids[0] == sorted_ids[1]
