"""The sampler's shortcuts (issue 23, item 3's cost budget): each skips work the numbers do
not need, and each gives what the long way gives. The long way here is plain numpy: a
count over the whole array, a full stable sort."""

from __future__ import annotations

import numpy as np
import pytest
from sampler_paths import built_kernel

from loopchat.engine import sampler, sampler_fused, sampler_math
from loopchat.engine.sampler import rank_of
from loopchat.engine.sampler_scratch import scratch
from loopchat.settings import SamplingSettings


def full_rank(x: np.ndarray, i: int) -> int:
    return int(np.count_nonzero(x > x[i])) + 1


@pytest.mark.parametrize("k", [1, 10, 40])
def test_a_rank_from_the_reported_top_is_the_rank_over_the_whole_array(k: int) -> None:
    """Inside the reported top the rank is counted among the entries before it; outside,
    over the whole array: both as a count over the whole array, ties included; the same where
    the caller says where in the top the entry is (`at`, sample()'s: -1 outside it)."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(49_152) * 3).astype(np.float32)
    order = np.argsort(-x, kind="stable")
    x[order[2]] = x[order[1]]  # a tie inside the top
    x[order[k + 3]] = x[order[k + 4]]  # and one below it
    top = sampler_math.top_indices(x, k)
    for i in [*order[: k + 8].tolist(), int(order[-1]), int(order[5000])]:
        assert rank_of(x, i, top) == full_rank(x, i), i
        at = top.tolist().index(i) if i in top.tolist() else -1
        assert rank_of(x, i, top, at) == full_rank(x, i), i


def test_a_rank_inside_the_top_makes_no_pass_over_the_array(monkeypatch) -> None:
    """(The numpy path, whose pass takes a scratch mask; the kernel's: the test below.)"""
    monkeypatch.setattr(sampler_fused, "kernel", None)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(262_144).astype(np.float32)
    top = sampler_math.top_indices(x, 40)
    passes: list[int] = []
    real = scratch.get

    def get(name: str, n: int, dtype: type) -> np.ndarray:
        passes.append(n)
        return real(name, n, dtype)

    monkeypatch.setattr(scratch, "get", get)
    assert rank_of(x, int(top[7]), top) == full_rank(x, int(top[7]))
    assert passes == []
    assert rank_of(x, int(np.argmin(x)), top) == 262_144 - np.count_nonzero(x == x.min()) + 1
    assert passes == [262_144]


def test_a_rank_inside_the_top_makes_no_pass_over_the_array_on_the_kernel(monkeypatch) -> None:
    monkeypatch.setattr(sampler_fused, "kernel", built_kernel())
    rng = np.random.default_rng(5)
    x = rng.standard_normal(262_144).astype(np.float32)
    top = sampler_math.top_indices(x, 40)
    passes: list[int] = []
    real = sampler_fused.count_greater

    def count_greater(a: np.ndarray, i: int) -> int:
        passes.append(a.shape[0])
        return real(a, i)

    monkeypatch.setattr(sampler_fused, "count_greater", count_greater)
    assert rank_of(x, int(top[7]), top) == full_rank(x, int(top[7]))
    assert passes == []
    assert rank_of(x, int(np.argmin(x)), top) == 262_144 - np.count_nonzero(x == x.min()) + 1
    assert passes == [262_144]


def test_top_p_reached_by_the_top_token_alone_needs_no_search(monkeypatch) -> None:
    """A sharp step (the instruct model's usual one): the most likely token holds top_p
    of the mass by itself. It is kept alone, with the share it holds, and no top-64 or
    bins search runs; the first of two equal top logits is the one kept (a sort's order)."""
    n = 262_144
    rng = np.random.default_rng(6)
    logits = rng.standard_normal(n).astype(np.float32)
    logits[[900, 77]] = 30.0  # two equal top logits, far above the rest
    searched: list[str] = []
    real_top, real_bins = sampler_math.top_indices, sampler_math.top_p_bins

    def top_indices(x: np.ndarray, k: int) -> np.ndarray:
        searched.append(f"top {k}")
        return real_top(x, k)

    def top_p_bins(x: np.ndarray, q: np.ndarray, target: float) -> tuple[np.ndarray, float]:
        searched.append("bins")
        return real_bins(x, q, target)

    monkeypatch.setattr(sampler_math, "top_indices", top_indices)
    monkeypatch.setattr(sampler_math, "top_p_bins", top_p_bins)
    kept, share = sampler_math.top_p_positions(logits, None, 0.3)
    assert searched == []
    assert kept.tolist() == [77]
    q = np.exp(logits.astype(np.float64) - 30.0)
    assert share == pytest.approx(1.0 / q.sum(), rel=1e-12)
    # the whole chain keeps that one token and reports it as the full sort would
    s = SamplingSettings(temperature=1.0, top_k=0, top_p=0.3, min_p=0.0, repeat_penalty=1.0)
    res = sampler.sample(logits, [], s, sampler.make_rng(0), report_k=10)
    assert (res.kept, res.token_id, res.sampled_prob) == (1, 77, 1.0)
    assert res.stages[3].stage == "top_p" and res.stages[3].kept_mass == pytest.approx(1.0 / q.sum(), rel=1e-6)


@pytest.mark.parametrize("spread", [40.0, 1e-3, 1e-30])
def test_the_bins_in_float32_keep_what_a_full_sort_keeps(spread: float) -> None:
    """top_p_bins bins the logits in float32 (a bin index still rises with the logit);
    a spread too narrow for float32's scale takes float64. Either way: a sort's prefix."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(50_000) * spread).astype(np.float32)
    x[[10, 20, 30]] = x.max()  # equal top logits: kept in id order
    q = np.exp(x.astype(np.float64) - float(x.max()))
    order = np.argsort(-x, kind="stable")
    for top_p in (0.01, 0.5, 0.9, 0.999):
        target = top_p * float(q.sum())
        kept, mass = sampler_math.top_p_bins(x, q, target)
        cum = np.cumsum(q[order])
        n_keep = int(np.searchsorted(cum, target, side="left")) + 1
        assert sorted(kept.tolist()) == sorted(order[:n_keep].tolist()), top_p
        assert mass == pytest.approx(float(cum[n_keep - 1]), rel=1e-12)


def test_the_work_max_is_known_through_the_penalties() -> None:
    """Candidates.work_max follows the repeat penalty's and DRY's changes (None where the
    token that held it changed): where known, it is the penalized logits' max exactly, so
    top-p, min-p and the distribution take it instead of a pass over the vocabulary."""
    from loopchat.engine.sampler_stages import Candidates, chain_for

    rng = np.random.default_rng(8)
    n = 5000
    known = 0
    for trial in range(60):
        logits = (rng.standard_normal(n) * 3).astype(np.float32)
        top = int(np.argmax(logits))
        context = [int(t) for t in rng.integers(0, n, 40)]
        if trial % 3 == 0:
            context.append(top)  # the top token penalized: its max not known
        if trial % 4 == 0:
            logits[context[5]] = logits.max() + 1.0  # ... or a penalized token still the top
        penalty = (1.1, 0.5, 1.5)[trial % 3]  # (0.5 raises the context's logits)
        s = SamplingSettings(repeat_penalty=penalty, repeat_last_n=64, dry_multiplier=0.8, top_k=0)
        raw_top = sampler_math.top_indices(logits, 10)
        c = Candidates(logits, context, float(logits.max()), 1.0, raw_top, 10)
        for stage in chain_for(s)[:2]:  # the repeat penalty, DRY
            stage.apply(c)
        if c.work_max is not None:
            known += 1
            assert c.work_max == float(c.work.max())
            assert c.work[c.work_max_id] == c.work.max()
        assert c.source_max(c.source()) == float(c.work.max())
    assert 10 < known < 60  # both cases were met
