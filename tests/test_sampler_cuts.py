"""The stages' cut token without a copy of the logits (sampler_cuts.cut_after, cut_below:
the kernel's read-only passes) against first_cut (a copy and an argmax), on rows made to
break them: equal logits around the cut, -inf logits, a cut at either end of the row."""

from __future__ import annotations

import numpy as np
import pytest
from sampler_paths import built_kernel, sampler_path  # noqa: F401 (a fixture)
from test_sampler_kernel import ROWS

from loopchat.engine import sampler_fused
from loopchat.engine.sampler_cuts import cut_after, cut_below, first_cut, top_and_cut
from loopchat.engine.sampler_math import top_indices


def kept_prefixes(x: np.ndarray) -> list[np.ndarray]:
    """What top-p keeps (a prefix of the order by logit, largest first, equal ones by id) and
    what top-k keeps (top_indices: equal logits at its edge in the search's order)."""
    order = np.argsort(-x, kind="stable")
    sizes = sorted({1, 2, 3, 4, 7, 40, 41, x.shape[0] // 3, x.shape[0] - 1} & set(range(1, x.shape[0])))
    return [order[:n] for n in sizes] + [top_indices(x, n) for n in sizes]


@pytest.mark.parametrize("name", [n for n in ROWS if n not in ("one",)])
@pytest.mark.usefixtures("sampler_path")
def test_cut_after_names_the_token_first_cut_names(name: str) -> None:
    x = ROWS[name]
    for kept in kept_prefixes(x):
        assert cut_after(x, None, kept) == first_cut(x, None, kept), (name, kept.shape[0])


def with_ties_at_the_edge() -> np.ndarray:
    """Many equal logits: a top-k edge inside a run of them, kept out of id order."""
    x = np.zeros(9000, dtype=np.float32)
    x[[10, 4000, 8999]] = 3.0
    x[[5, 6, 7000]] = 2.0
    x[[0, 8000]] = -np.inf
    return x


@pytest.mark.parametrize("name", [n for n in ROWS if n not in ("one", "odd")])
@pytest.mark.usefixtures("sampler_path")
def test_cut_after_among_the_tokens_a_constraint_allows(name: str) -> None:
    """Top-p after the constraint: the entered tokens are the mask's (most of the vocabulary,
    ascending), the pass reads the mask, not their ids."""
    x = ROWS[name]
    rng = np.random.default_rng(7)
    mask = rng.random(x.shape[0]) < 0.8
    mask[[5, 900]] = False  # (two of the tied top logits forbidden: a forbidden token ties the kept)
    entered = np.flatnonzero(mask)
    order = np.lexsort((entered, -x[entered]))
    for n in (1, 2, 40, entered.shape[0] // 3, entered.shape[0] - 1):
        kept = entered[order[:n]]
        assert cut_after(x, entered, kept, mask) == first_cut(x, entered, kept), (name, n)
    assert cut_after(x, entered, entered, mask) == -1


@pytest.mark.usefixtures("sampler_path")
def test_cut_after_where_a_tied_token_before_the_kept_ones_was_not_kept() -> None:
    x = with_ties_at_the_edge()
    for kept in ([10, 4000, 8999, 7000], [4000, 10, 8999, 6], [10, 8999, 4000]):
        ids = np.array(kept)
        assert cut_after(x, None, ids) == first_cut(x, None, ids), kept
    assert cut_after(x, None, np.flatnonzero(x > -np.inf)) == -1  # (only -inf logits left: none)


@pytest.mark.parametrize("name", [n for n in ROWS if n not in ("one",)])
@pytest.mark.usefixtures("sampler_path")
def test_cut_below_names_the_token_first_cut_names(name: str) -> None:
    x = ROWS[name]
    rng = np.random.default_rng(5)
    finite = x[np.isfinite(x)]
    for floor in {float(finite.max()), float(finite.max()) - 1e-9, float(np.median(finite)), -1e30}:
        kept = np.flatnonzero(x.astype(np.float64) >= floor)
        assert cut_below(x, None, kept, x, floor) == first_cut(x, None, kept), (name, floor)
        # candidates an earlier stage narrowed, in no id order (top-p's bins): a gather of them
        entered = rng.permutation(x.shape[0])[: max(1, x.shape[0] // 2)]
        src = x[entered]
        kept = entered[src.astype(np.float64) >= floor]
        assert cut_below(x, entered, kept, src, floor) == first_cut(x, entered, kept), (name, floor)
        # the position from min-p's own pass (the kernel's: None on numpy's path): over these ids, looking
        # for a second equal logit; over ascending ids (the constraint's), the first position alone
        at = sampler_fused.min_p_keep(src, floor, 0.0, True)[3]
        assert cut_below(x, entered, kept, src, floor, False, at) == first_cut(x, entered, kept), (name, floor)
        ascending = np.sort(entered)
        src = x[ascending]
        kept = ascending[src.astype(np.float64) >= floor]
        at = sampler_fused.min_p_keep(src, floor, 0.0)[3]
        assert cut_below(x, ascending, kept, src, floor, True, at) == first_cut(x, ascending, kept), (name, floor)


@pytest.mark.usefixtures("sampler_path")
def test_top_and_cut_keeps_what_top_indices_keeps_where_logits_tie() -> None:
    """The chain's top-k is the reference's top_indices(work, k), ties included (a search for
    k + 1 orders equal logits its own way), and its cut the token after them."""
    x = ROWS["ties"]
    for k in (1, 2, 3, 10, 40):
        ids, cut = top_and_cut(x, k, None)
        assert np.array_equal(ids, top_indices(x, k)), k
        assert cut == first_cut(x, None, ids), k
        raw = top_indices(x, k)  # (the raw top ids, k of them: what the chain reported)
        ids, cut = top_and_cut(x, k, raw)
        assert np.array_equal(ids, raw) and cut == first_cut(x, None, ids), k
    spread = ROWS["spread"]
    ids, cut = top_and_cut(spread, 40, None)
    assert np.array_equal(ids, top_indices(spread, 40)) and cut == int(top_indices(spread, 41)[40])


def test_the_kernels_cut_passes() -> None:
    k = built_kernel()
    x = np.array([1, 5, 3, 5, 2, 3, -np.inf], dtype=np.float32)
    assert k.cut_below(x, 5.0) == (2, 2)  # the first of the largest below 5, and two 5s
    assert k.cut_below(x, 1.0) == (-1, 1)  # only -inf below: none
    assert k.first_equal(x, 5.0, 2) == 3 and k.first_equal(x, 4.0, 0) == -1
    mask = np.array([1, 1, 0, 1, 1, 1, 1], dtype=np.uint8)  # (3 at position 2 forbidden: the one at 5)
    assert k.cut_below_mask(x, 5.0, mask) == (5, 2)
    assert k.cut_below_mask(x, 5.0, np.array([0, 0, 0, 1, 0, 0, 1], dtype=np.uint8)) == (-1, 1)


def test_the_masked_cut_below_is_numpys_over_long_rows() -> None:
    """cut_below_mask on rows past its eight-lane groups (lengths around 16's multiples), masks
    that allow most or few tokens, thresholds with ties (coarse logits): the first allowed
    position of the largest allowed logit below v (-1 where none), and the allowed ties of v."""
    k = built_kernel()
    rng = np.random.default_rng(12)
    for n in (16, 17, 31, 1000, 4111, 65_543):
        x = np.round(rng.standard_normal(n) * 4).astype(np.float32)  # (many equal values)
        x[rng.integers(0, n, n // 20 + 1)] = -np.inf
        for allowed in (0.97, 0.05):
            mask = rng.random(n) < allowed
            for v in (np.float32(0.0), np.float32(3.0), x.max(), np.float32(-100.0)):
                below = mask & (x < v) & (x > -np.inf)
                want_i = int(np.flatnonzero(mask & (x == x[below].max()))[0]) if below.any() else -1
                want = (want_i, int(np.count_nonzero(mask & (x == v))))
                assert k.cut_below_mask(x, float(v), mask.view(np.uint8)) == want, (n, allowed, float(v))


def test_take_is_numpys_gathers_over_long_rows() -> None:
    """take (top-p's kept set as the new candidates, sampler_topp): cand[kept] and src[kept] with the
    least of those and its ties, as numpy's gathers, min and count give them, on long rows with ties
    and -inf, the kept positions in the unsorted order top-p leaves them (ascending, then a bin's
    block), and against both paths of sampler_fused.take; a position outside src is an error."""
    k = built_kernel()
    rng = np.random.default_rng(13)
    for n in (1, 17, 4111, 262_147):
        src = np.round(rng.standard_normal(n) * 4).astype(np.float32)  # (many equal values)
        src[rng.integers(0, n, n // 20 + 1)] = -np.inf
        cand = np.sort(rng.choice(n + n // 3, n, replace=False)).astype(np.int64)
        for share in (1.0, 0.9, 0.01):
            chosen = np.flatnonzero(rng.random(n) < share)
            kept = np.concatenate([chosen[::2], chosen[1::2][::-1]]).astype(np.int64)
            if not kept.shape[0]:
                continue
            low = src[kept].min()
            want = (cand[kept], src[kept], float(low), int(np.count_nonzero(src[kept] == low)))
            for c in (cand, None):
                ids, out = np.full(kept.shape[0], -1, np.int64), np.full(kept.shape[0], np.nan, np.float32)
                assert k.take(kept, c, src, ids, out) == want[2:], (n, share)
                assert np.array_equal(ids, want[0] if c is not None else kept) and np.array_equal(out, want[1])
                for kernel in (k, None):
                    sampler_fused.kernel = kernel
                    try:
                        got = sampler_fused.take(kept, c, src)
                    finally:
                        sampler_fused.kernel = k
                    assert np.array_equal(got[0], want[0] if c is not None else kept) and got[2:] == want[2:]
    with pytest.raises(IndexError):
        k.take(
            np.array([0, 5], np.int64), None, np.zeros(5, np.float32), np.empty(2, np.int64), np.empty(2, np.float32)
        )
