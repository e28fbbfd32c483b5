"""The penalties' copy of the logits made by the raw softmax's pass (issue 24, tenth session): the
kernel's raw_sums and raw_sums64 copy the logits into `copy` as they read them, on one thread or
two (the helper's half copied by the helper), with the same sums to the bit; the chain then gives
the repeat penalty, DRY and a logit bias that copy instead of copying the vocabulary again, and
every figure it reports is the same as with the penalties' own copy."""

from __future__ import annotations

import numpy as np
import pytest
from sampler_paths import built_kernel

from loopchat.engine import sampler, sampler_fused, sampler_raw
from loopchat.settings import SamplingSettings


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    k = built_kernel()
    monkeypatch.setattr(sampler_fused, "kernel", k)
    assert sampler_raw.probe(k)
    yield k
    sampler_fused.use_threads(1)


def test_the_raw_pass_copies_the_logits_with_the_same_sums_on_one_thread_or_two(kernel) -> None:  # type: ignore[no-untyped-def]
    """Every length the pass cuts its own way (a short leaf, a tail, numpy's pairwise halves, a row
    the helper takes half of): the copy is the logits exactly, the sums the bits of the pass without it."""
    rng = np.random.default_rng(31)
    for threads in (1, 2):
        sampler_fused.use_threads(threads)
        for n in (1, 7, 16, 129, 1000, 49_152, 262_144, 262_147):
            x = (rng.standard_normal(n) * 3).astype(np.float32)
            m = float(x.max())
            for name in ("raw_sums", "raw_sums64"):
                copy = np.full(n, np.nan, dtype=np.float32)
                kernel.wake(5000)
                with_copy = getattr(kernel, name)(x, m, copy)
                assert with_copy == getattr(kernel, name)(x, m), (name, n, threads)
                assert copy.tobytes() == x.tobytes(), (name, n, threads)
    with pytest.raises(ValueError):
        kernel.raw_sums(np.zeros(10, dtype=np.float32), 0.0, np.zeros(9, dtype=np.float32))


def _figures(res: sampler.SampleResult) -> tuple:
    return (
        res.token_id,
        res.raw_top_ids.tolist(),
        res.raw_top_probs.tobytes(),
        res.sampled_top_ids.tolist(),
        res.sampled_top_probs.tobytes(),
        res.raw_prob,
        res.sampled_prob,
        res.raw_entropy,
        res.sampled_entropy,
        res.kept,
        res.stages,
    )


def test_the_penalties_take_the_raw_passs_copy_and_report_the_same(kernel, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With a repeat penalty, DRY and a logit bias on, the kernel's change_logits is never asked to
    copy the vocabulary (the raw pass did), and every figure and token is the one the chain gives
    with the penalties' own copy (a kernel whose raw pass takes no `copy`)."""
    rng = np.random.default_rng(5)
    row = (rng.standard_normal(262_144) * 2).astype(np.float32)
    context = [int(t) for t in rng.integers(0, 2000, 300)] + [7, 8, 9, 7, 8]
    s = SamplingSettings(top_k=0, top_p=0.95, min_p=0.0, temperature=2.0, seed=1, dry_multiplier=0.8)
    s = s.replace(logit_bias=((8, 5.0), (11, -3.0)))
    copies: list[bool] = []
    real = kernel.change_logits

    def spy(*args: object) -> object:
        copies.append(bool(args[6]))
        return real(*args)

    monkeypatch.setattr(kernel, "change_logits", spy)
    got = [_figures(sampler.sample(row, context, s, sampler.make_rng(i), 40)) for i in range(3)]
    assert copies and not any(copies)
    monkeypatch.setattr(sampler_raw, "_COPIES", False)  # (as a kernel built before the copy)
    copies.clear()
    want = [_figures(sampler.sample(row, context, s, sampler.make_rng(i), 40)) for i in range(3)]
    assert copies[0] is True
    assert got == want


def test_the_raw_max_from_the_raw_tops_pass_is_numpys_max(kernel) -> None:  # type: ignore[no-untyped-def]
    """sample() takes the raw max from the kernel's top-K pass where it answers (no tie among the
    top, no NaN) instead of numpy's max pass: on rows with a distinct max, a tie at the max, a max of
    0.0 beside -0.0, and a tie inside the top K, the raw figures are numpy's, bit for bit."""
    rng = np.random.default_rng(9)
    base = (rng.standard_normal(49_152) * 3).astype(np.float32)
    tied_top, zero_top, tied_inside = base.copy(), base - base.max(), base.copy()
    tied_top[[5, 900]] = base.max() + 1
    zero_top[[3, 4]] = (-0.0, 0.0)
    tied_inside[np.argsort(-base)[[3, 4]]] = base[np.argsort(-base)[2]]
    s = SamplingSettings(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0, seed=1, repeat_penalty=1.0)
    for row in (base, tied_top, zero_top, tied_inside):
        res = sampler.sample(row, [], s, sampler.make_rng(0), 10)
        shifted = row - np.float32(float(row.max()))
        e = np.exp(shifted)
        total, dot = float(e.sum()), float(np.einsum("i,i->", e, shifted))
        want_entropy = (np.log(total) - dot / total) / np.log(2.0)
        assert res.raw_top_ids.tolist() == sampler.top_indices(row, 10).tolist()
        assert res.raw_top_probs.tobytes() == (e[res.raw_top_ids].astype(np.float64) / total).tobytes()
        assert res.raw_entropy == pytest.approx(want_entropy, abs=1e-12)
