"""The sampling chain on synthetic logits, against straightforward reference code."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loopchat.engine import sampler, sampler_fused, sampler_math
from loopchat.settings import SamplingSettings


def softmax(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64) - x.max()
    e = np.exp(z)
    return e / e.sum()


@pytest.mark.parametrize("n,k", [(10, 3), (5000, 10), (49152, 10), (49152, 40), (49152, 300), (100, 100)])
def test_top_indices_is_exact(n: int, k: int) -> None:
    rng = np.random.default_rng(n + k)
    for _ in range(20):
        x = (rng.standard_normal(n) * 3).astype(np.float32)
        got = sampler.top_indices(x, k)
        want = np.argsort(-x, kind="stable")[:k]
        assert np.array_equal(x[got], x[want])


def test_top_indices_with_many_ties() -> None:
    x = np.zeros(49152, dtype=np.float32)
    x[[5, 17, 40000]] = 1.0
    got = sampler.top_indices(x, 10)
    assert sorted(got[:3].tolist()) == [5, 17, 40000]
    assert len(got) == 10 and np.all(x[got[3:]] == 0)


def reference_chain(logits: np.ndarray, recent: list[int], s: SamplingSettings) -> dict[int, float]:
    """The documented chain, written plainly over the whole vocabulary."""
    work = logits.copy()  # the penalty in float32, as the logits come from llama.cpp
    for t in set(recent[-s.repeat_last_n :]) if s.repeat_penalty != 1.0 else ():
        work[t] = work[t] / np.float32(s.repeat_penalty) if work[t] > 0 else work[t] * np.float32(s.repeat_penalty)
    work = work.astype(np.float64)
    order = list(np.argsort(-work, kind="stable"))
    if s.temperature == 0:
        return {int(order[0]): 1.0}
    if s.top_k > 0:
        order = order[: s.top_k]
    if s.top_p < 1.0:
        p = softmax(work[order])
        cum, keep = 0.0, len(p)
        for i, pi in enumerate(p, 1):
            cum += pi
            if cum >= s.top_p:
                keep = i
                break
        order = order[:keep]
    if s.min_p > 0:
        floor = work[order[0]] + math.log(s.min_p)
        order = [t for t in order if work[t] >= floor]
    q = softmax(work[order] / s.temperature)
    return {int(t): float(pi) for t, pi in zip(order, q)}


@pytest.mark.parametrize(
    "settings",
    [
        SamplingSettings(),
        SamplingSettings(temperature=1.5, top_k=0, top_p=0.9, min_p=0.0, repeat_penalty=1.0),
        SamplingSettings(temperature=0.3, top_k=5, top_p=1.0, min_p=0.0, repeat_penalty=1.3),
        SamplingSettings(temperature=1.0, top_k=100, top_p=0.5, min_p=0.1, repeat_penalty=0.8),
        SamplingSettings(temperature=0.0, repeat_penalty=1.5),
        # more candidates than the chain sorts (SORT_LIMIT): top-k off or very large
        SamplingSettings(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0),
        SamplingSettings(temperature=0.8, top_k=0, top_p=1.0, min_p=0.05, repeat_penalty=1.1),
        SamplingSettings(temperature=1.2, top_k=0, top_p=0.999, min_p=0.0, repeat_penalty=1.1),
        SamplingSettings(temperature=0.7, top_k=0, top_p=0.95, min_p=0.02, repeat_penalty=1.0),
        SamplingSettings(temperature=1.0, top_k=3000, top_p=1.0, min_p=0.0, repeat_penalty=1.0),
        SamplingSettings(temperature=1.0, top_k=3000, top_p=0.99, min_p=0.0, repeat_penalty=1.0),
        SamplingSettings(temperature=1.0, top_k=1_000_000, top_p=1.0, min_p=0.0, repeat_penalty=1.0),
    ],
)
def test_sampled_distribution_matches_the_reference_chain(settings: SamplingSettings) -> None:
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal(4000) * 4).astype(np.float32)
    recent = [int(i) for i in np.argsort(-logits)[:8]] + [3, 3, 7]
    ref = reference_chain(logits, recent, settings)
    res = sampler.sample(logits, recent, settings, sampler.make_rng(0), report_k=10)
    assert res.kept == len(ref)
    top = sorted(ref.items(), key=lambda kv: -kv[1])[:10]
    assert [int(i) for i in res.sampled_top_ids] == [t for t, _ in top]
    assert res.sampled_top_probs.tolist() == pytest.approx([p for _, p in top], abs=1e-9)
    assert res.token_id in ref
    assert res.sampled_prob == pytest.approx(ref[res.token_id], abs=1e-9)
    assert res.sampled_rank == 1 + sum(p > ref[res.token_id] for p in ref.values())
    raw = softmax(logits)
    assert res.raw_prob == pytest.approx(raw[res.token_id], rel=1e-5)
    assert res.raw_top_probs.tolist() == pytest.approx(np.sort(raw)[::-1][:10].tolist(), rel=1e-5)
    # the drawn token's raw probability is the very number its raw top-K entry shows
    # (the wire sends both as logprobs: they must not differ in the 8th digit)
    for i, p in zip(res.raw_top_ids.tolist(), res.raw_top_probs.tolist()):
        if i == res.token_id:
            assert res.raw_prob == p


def test_draws_follow_the_sampled_distribution() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.2] + [1e-9] * 97, dtype=np.float32))
    s = SamplingSettings(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
    rng = sampler.make_rng(42)
    counts = np.zeros(3)
    for _ in range(4000):
        counts[sampler.sample(logits, [], s, rng).token_id] += 1
    assert counts / counts.sum() == pytest.approx([0.5, 0.3, 0.2], abs=0.03)


def test_entropy_in_bits() -> None:
    uniform = np.zeros(1024, dtype=np.float32)
    assert sampler.entropy_bits(uniform) == pytest.approx(10.0)
    res = sampler.sample(
        uniform,
        [],
        SamplingSettings(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0, repeat_penalty=1.0),
        sampler.make_rng(0),
    )
    assert res.raw_entropy == pytest.approx(10.0, abs=1e-4)
    assert res.sampled_entropy == pytest.approx(10.0, abs=1e-4)


@pytest.mark.parametrize("shape", ["sharp", "spread", "flat"])
def test_top_p_over_a_large_vocabulary_is_exact_on_each_path(shape: str, monkeypatch) -> None:
    """Top-k off on a 262,144-token vocabulary (Gemma 3's size): the cut-off is found in
    the exact top 64 (sharp), among the tokens above a sampled threshold (spread), or by
    the bins over the whole vocabulary (flat); each against the full-sort reference. (The
    bins run in numpy's steps or the kernel's, top_p_bins, or inside its one call for the
    search, top_p_deep, whose answer says over which set.)"""
    n = 262_144
    rng = np.random.default_rng(11)
    logits = rng.standard_normal(n).astype(np.float32)
    if shape == "sharp":
        logits[rng.choice(n, 5, replace=False)] += 14.0
    elif shape == "spread":
        logits[rng.choice(n, 2000, replace=False)] += 9.0
    else:
        logits *= 0.5
    logits[[7, 70_000]] = logits.max()  # a tie at the top: equal logits go in id order
    binned: list[int] = []
    real_bins, one_call = sampler_math.top_p_bins, sampler_fused.top_p_deep
    monkeypatch.setattr(
        sampler_math, "top_p_bins", lambda x, q, t, **kw: binned.append(x.shape[0]) or real_bins(x, q, t, **kw)
    )

    def top_p_deep(src, *args):  # type: ignore[no-untyped-def]
        out = one_call(src, *args)  # (the kernel's bins in its one call: over the deep set or every token)
        if out is not None and out[0] in ("deep", "all"):
            binned.append(out[6][0].shape[0] if out[0] == "deep" else src.shape[0])
        return out

    monkeypatch.setattr(sampler_fused, "top_p_deep", top_p_deep)
    s = SamplingSettings(temperature=1.3, top_k=0, top_p=0.9, min_p=0.0, repeat_penalty=1.0)
    ref = reference_chain(logits, [], s)
    res = sampler.sample(logits, [], s, sampler.make_rng(3), report_k=40)
    assert {"sharp": binned == [], "spread": len(binned) == 1 and binned[0] < n // 4, "flat": binned == [n]}[shape], (
        binned
    )
    assert res.kept == len(ref)
    top = sorted(ref.items(), key=lambda kv: -kv[1])[:40]
    assert res.sampled_top_probs.tolist() == pytest.approx([p for _, p in top], abs=1e-9)
    assert res.sampled_prob == pytest.approx(ref[res.token_id], abs=1e-9)
    nz = np.array(list(ref.values()))
    assert res.sampled_entropy == pytest.approx(float(-(nz * np.log2(nz)).sum()), abs=1e-6)


def test_the_unsorted_draw_finds_what_a_whole_cumulative_sum_finds() -> None:
    rng = np.random.default_rng(5)
    probs = rng.random(262_144) ** 4
    probs /= probs.sum()
    cum = np.cumsum(probs)
    for u in list(rng.random(300)) + [0.0, 1.0 - 1e-12]:
        assert sampler_math.draw_unsorted(probs, u) == min(
            int(np.searchsorted(cum, u, side="right")), probs.shape[0] - 1
        )
