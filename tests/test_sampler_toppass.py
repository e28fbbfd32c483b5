"""Top-p over a large vocabulary in one pass (issue 23, item 3's budget, 5 December 2026):
the kernel's exp_sum_above (the total and the deep set in one pass over the vocabulary) and
top_p_cut (top_p_bins' steps in one call) give what the numpy passes give, and the pass is
the only one top-p makes over the vocabulary where the deep set holds the cut-off. The
kernel's float64 exp (four lanes by hand, AVX2 + FMA) gives a value the same bits in any
lane. The chain on both paths against the reference: tests/test_sampler_chain.py,
test_sampler_kernel.py."""

from __future__ import annotations

import numpy as np
import pytest
from sampler_paths import built_kernel
from test_sampler_kernel import ROWS, close, ulps

from loopchat.engine import sampler_fused, sampler_math


def numpy_path():  # type: ignore[no-untyped-def]
    """sampler_fused's numpy path for the duration (a context manager's worth, by hand)."""

    class Off:
        def __enter__(self) -> None:
            self.saved, sampler_fused.kernel = sampler_fused.kernel, None

        def __exit__(self, *exc: object) -> None:
            sampler_fused.kernel = self.saved

    return Off()


@pytest.fixture
def kernel_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_fused, "kernel", built_kernel())


@pytest.mark.usefixtures("kernel_on")
@pytest.mark.parametrize("name", list(ROWS))
def test_the_deep_set_and_the_total_in_one_pass_are_the_numpy_passes(name: str) -> None:
    """Every position at or above the threshold, in order, with its exp (2 ulp of numpy's),
    and the total (another order of addition: 1e-11), for thresholds that keep none, some,
    all, ties and -inf."""
    x = ROWS[name]
    finite = x[np.isfinite(x)]
    mx = float(finite.max())
    for v in {x.max(), x[0], np.float32(np.median(finite)), finite.min(), np.float32(np.inf), np.float32(-np.inf)}:
        total, deep, q = (a.copy() if isinstance(a, np.ndarray) else a for a in sampler_fused.exp_sum_above(x, mx, v))
        with numpy_path():
            want_total, want_deep, want_q = sampler_fused.exp_sum_above(x, mx, v)
        assert deep.dtype == want_deep.dtype and np.array_equal(deep, want_deep), v
        assert np.array_equal(deep, np.flatnonzero(x >= v))
        assert np.array_equal(q == 0, want_q == 0) and np.all(ulps(q, want_q)[want_q > 0] <= 2.0)
        assert close(total, want_total)


@pytest.mark.usefixtures("kernel_on")
@pytest.mark.parametrize("name", [n for n in ROWS if n != "-inf"])
def test_the_cut_off_in_one_call_is_top_p_bins_step_for_step(name: str) -> None:
    """top_p_cut keeps the same positions in the same order (the draw's order) with the same
    mass, to the bit, as top_p_bins' numpy steps; it declines (None) what numpy must do."""
    x = ROWS[name]
    q = np.exp(x.astype(np.float64) - x.max())
    total = float(q.sum())
    for p in (1e-9, 0.3, 0.9, 0.95, 0.999, 1.0, 2.0):
        got = sampler_fused.top_p_cut(x, q, p * total, 2048)
        with numpy_path():
            want = sampler_math.top_p_bins(x, q, p * total)
        if x.max() == x.min():
            assert got is None  # (numpy's path: every token in one bin)
            continue
        assert got is not None
        assert got[0].dtype == want[0].dtype and np.array_equal(got[0], want[0]), p
        assert got[1] == want[1], p
    with_inf = ROWS["-inf"]
    q = np.exp(with_inf.astype(np.float64) - with_inf.max())
    assert sampler_fused.top_p_cut(with_inf, q, 0.9 * float(q.sum()), 2048) is None


@pytest.mark.usefixtures("kernel_on")
def test_top_p_makes_one_pass_over_the_vocabulary_where_the_deep_set_holds_it(monkeypatch) -> None:
    """A flat-ish row of Gemma 3's size whose cut-off lies below the exact top 64 but inside
    the deep set: the total and the deep set come from one pass (exp_sum_above, inside the kernel's
    one call for the search since chain10: top_p_deep, whose bins then read the deep set alone); no
    other pass of the kernel reads the whole vocabulary (the head and the deep set used to be
    found by two more, at_least's), the masses are not stored by a second pass, and the
    cut-off is the full sort's."""
    n = 262_144
    rng = np.random.default_rng(12)
    x = (rng.standard_normal(n) * 0.5).astype(np.float32)
    x[rng.choice(n, 3000, replace=False)] += 8.0  # the cut-off among these
    whole: list[str] = []
    for name in ("at_least", "exp_sum", "exp_sum_above", "count_greater", "weights_of", "top_p_deep"):
        real = getattr(sampler_fused, name)

        def spy(a: np.ndarray, *args: object, _real=real, _name=name) -> object:  # type: ignore[no-untyped-def]
            out = _real(a, *args)
            if a.shape[0] == n:  # (top_p_deep: which bins it ran, "deep": the deep set's alone)
                whole.append(_name if _name != "top_p_deep" else f"{_name} {out and out[0]}")
            return out

        monkeypatch.setattr(sampler_fused, name, spy)
    kept, share = sampler_math.top_p_positions(x, None, 0.9)
    assert whole == ["top_p_deep deep"]
    q = np.exp(x.astype(np.float64) - x.max())
    order = np.argsort(-x, kind="stable")
    cum = np.cumsum(q[order])
    n_keep = int(np.searchsorted(cum, 0.9 * cum[-1], side="left")) + 1
    assert 64 < n_keep < 8192
    assert np.array_equal(np.sort(kept), np.sort(order[:n_keep]))
    assert share == pytest.approx(cum[n_keep - 1] / cum[-1], abs=1e-12)


def test_the_kernels_exp_gives_a_value_the_same_bits_in_any_lane() -> None:
    """The passes compute four or eight values at a time and pad a short tail: a value's exp
    must not depend on where it falls (the draw recomputes a block's weights, a report a
    few gathered ones, and sums them against the pass's)."""
    k = built_kernel()
    rng = np.random.default_rng(3)
    x = np.concatenate([-rng.random(1003) * 40.0, -rng.random(13) * 745.0, [0.0, -0.0, -np.inf, np.nan]])
    whole = np.empty_like(x)
    k.exp(x, whole)
    for start in range(1, 9):
        part = np.empty(x.shape[0] - start)
        k.exp(np.ascontiguousarray(x[start:]), part)
        assert whole[start:].tobytes() == part.tobytes(), start
    for i in range(x.shape[0]):
        one = np.empty(1)
        k.exp(x[i : i + 1].copy(), one)
        assert whole[i : i + 1].tobytes() == one.tobytes(), i


@pytest.mark.usefixtures("kernel_on")
def test_the_cut_off_finds_the_rows_least_and_greatest_logit_in_any_lane() -> None:
    """top_p_cut's span (its least and greatest logit, found eight lanes at a time from the
    first logit) is numpy's wherever the extremes sit: the first position, any lane, the tail
    past the last full group; and every position kept (p 2) or one bin's worth fill kept from
    both ends without a position lost."""
    rng = np.random.default_rng(11)
    for n in (64, 65, 79, 80, 1000, 4099):
        for at in {0, 1, 7, 8, 15, 16, n // 2, n - 9, n - 2, n - 1}:
            x = rng.standard_normal(n).astype(np.float32)
            x[at], x[(at + n // 3) % n] = 9.0, -9.0
            q = np.exp(x.astype(np.float64) - 9.0)
            for p in (0.5, 2.0):
                got = sampler_fused.top_p_cut(x, q, p * float(q.sum()), 2048)
                with numpy_path():
                    want = sampler_math.top_p_bins(x, q, p * float(q.sum()))
                assert got is not None and np.array_equal(got[0], want[0]) and got[1] == want[1], (n, at, p)


@pytest.mark.usefixtures("kernel_on")
def test_the_cut_offs_split_by_eight_lanes_is_numpys_over_long_rows() -> None:
    """top_p_cut's split (the positions above the cut bin, eight at a time by AVX2, and the cut bin's,
    written over its index array) keeps numpy's positions in numpy's order with numpy's mass on rows
    of Gemma's size and a few more (a tail past the last group of eight): logits on a coarse grid, so
    that the cut bin holds thousands of positions in every lane and the groups mix all three sides,
    and a flat row where the cut keeps most of the vocabulary."""
    rng = np.random.default_rng(24)
    for n in (262_144, 262_147, 49_157):
        coarse = (rng.integers(0, 40, n) * 0.25).astype(np.float32)
        flat = (rng.standard_normal(n) * 0.3).astype(np.float32)
        for x in (coarse, flat):
            q = np.exp(x.astype(np.float64) - float(x.max()))
            for p in (0.05, 0.5, 0.95, 0.9999):
                got = sampler_fused.top_p_cut(x, q, p * float(q.sum()), 2048)
                assert got is not None
                kept, mass = got[0].copy(), got[1]
                with numpy_path():
                    want = sampler_math.top_p_bins(x, q, p * float(q.sum()))
                assert np.array_equal(kept, want[0]) and mass == want[1], (n, p)
