"""Fewer passes and calls in the chain under a constraint (issue 24, 2026-12-06, chain8): top-p's
cut token from its own search (the kernel's top_p_cut hands back the first position it did not
keep; a cut inside the deep set is looked for among the deep set's logits), the constraint's mask
unpacked only if a stage reads it, the raw top's probabilities in one kernel call, the chain's
stages kept from the last step for the same settings. Each gives the very figures of the path it
replaces: the cut token against cut_after's pass and first_cut's copy, the probabilities against
raw_exp's, the whole chain against the reference (tests/test_sampler_chain.py) and, on rows made
for it, against the same chain with the shortcuts off."""

from __future__ import annotations

import numpy as np
import pytest
from sampler_paths import built_kernel

from loopchat.engine import sampler, sampler_fused, sampler_math, sampler_topp
from loopchat.engine.sampler_cuts import first_cut
from loopchat.engine.sampler_raw import raw_softmax
from loopchat.engine.sampler_stages import chain_for
from loopchat.settings import SamplingSettings


@pytest.fixture
def kernel_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_fused, "kernel", built_kernel())


def _rows() -> list[np.ndarray]:
    """Rows of 262,147 on coarse grids (many equal logits: bins holding thousands, ties across
    the cut) and a smooth one, as logits come."""
    rng = np.random.default_rng(24)
    out = []
    for step in (0.5, 0.05, 0.0):
        x = rng.standard_normal(262_147) * 2.0
        if step:
            x = np.round(x / step) * step
        out.append(x.astype(np.float32))
    return out


@pytest.mark.usefixtures("kernel_on")
def test_top_p_cut_hands_back_the_most_likely_position_it_cut() -> None:
    """kept[k] after the k kept: the largest logit not kept, its first position, where the
    cut-off's bin holds one (-1: the bin kept whole); first_cut's answer."""
    seen = 0
    for x in _rows():
        q = np.exp(x.astype(np.float64) - float(x.max()))
        total = float(q.sum())
        for p in (0.1, 0.5, 0.9, 0.95, 0.99):
            out: list = []
            got = sampler_fused.top_p_cut(x, q, p * total, 2048, out)
            assert got is not None and len(out) == 1
            want = first_cut(x, None, got[0])
            if out[0] >= 0:
                assert out[0] == want, p
                seen += 1
            else:  # (the cut bin kept whole: the token is in a lower bin, cut_after's to find)
                assert x[want] < x[got[0]].min()
    assert seen >= 10


@pytest.mark.usefixtures("kernel_on")
@pytest.mark.parametrize("before", ["vocabulary", "allowed"])
def test_top_p_s_cut_token_from_its_search_is_cut_after_s(before: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """top_p_unsorted's cut token where its search found it (the bins' or the deep set's), against
    the same stage with that shortcut off (cut_after's pass, or first_cut's copy), over the whole
    vocabulary and over a constraint's ascending ids with its mask."""
    from loopchat.engine.sampler_candidates import Candidates

    rng = np.random.default_rng(7)
    hits = 0
    for x in _rows():
        for p in (0.3, 0.9, 0.95):
            got, want = [], []
            mask = rng.random(x.shape[0]) < 0.97
            for shortcut in (True, False):
                if not shortcut:
                    monkeypatch.setattr(sampler_topp, "_cut_inside", lambda *a: None)
                raw_max = float(x.max())
                top = sampler_math.top_indices(x, 10)
                c = Candidates(x, [], raw_max, float(np.exp(x.astype(np.float64) - raw_max).sum()), top, 10)
                if before == "allowed":
                    mask[top[0]] = True
                    c.ids = np.flatnonzero(mask)
                    c.allowed, c.allowed_n = mask, int(c.ids.shape[0])
                cut, share = sampler_topp.top_p_unsorted(c, p, (None, (c.norm, raw_max)))
                (got if shortcut else want).append((cut, share, c.ids.copy()))
                monkeypatch.undo()
                monkeypatch.setattr(sampler_fused, "kernel", built_kernel())
            assert got[0][0] == want[0][0] and got[0][1] == want[0][1] and np.array_equal(got[0][2], want[0][2])
            hits += got[0][0] >= 0
    assert hits >= 6


@pytest.mark.usefixtures("kernel_on")
def test_the_raw_top_s_probabilities_in_one_call_are_raw_exp_s() -> None:
    x = _rows()[2]
    raw = raw_softmax(x, float(x.max()))
    ids = sampler_math.top_indices(x, 40)
    want = raw.exp_at(ids).astype(np.float64) / raw.total
    assert np.array_equal(raw.probs_at(ids), want)
    with pytest.raises(IndexError):
        built_kernel().raw_probs(x, np.array([x.shape[0]], dtype=np.int64), 0.0, 1.0, np.empty(1))


def test_the_chain_is_the_settings_own_and_kept_for_the_same_objects() -> None:
    """The last step's stages for the same settings object; other settings (equal or not) their own."""
    a = SamplingSettings(top_k=0, top_p=0.9)
    b = SamplingSettings(top_k=0, top_p=0.5)
    assert sampler._chain_of(a, None) is sampler._chain_of(a, None)
    assert sampler._chain_of(b, None) == chain_for(b) != chain_for(a)
    assert sampler._chain_of(a, None) == chain_for(a)


@pytest.mark.usefixtures("kernel_on")
def test_the_sampled_top_above_64_is_numpys_partition() -> None:
    """sample_top's larger k of a larger sample (the kernel's threshold from every eighth: the deep
    set's 257 of Gemma's ~8,000): the values numpy's partition and sort give, on rows of grids,
    ties, infinities, signed zeros and sorted runs (a sample whose every eighth misses the top:
    declined, numpy's way)."""
    rng = np.random.default_rng(11)
    kinds = [
        lambda n: rng.standard_normal(n) * 3,
        lambda n: np.round(rng.standard_normal(n) * 4),
        lambda n: rng.standard_normal(n) * 1e-3 + 10,
        lambda n: rng.choice(np.array([-np.inf, 0.0, -0.0, 1.5, np.inf, -3.0]), n),
        lambda n: np.sort(rng.standard_normal(n)),
    ]
    used = 0
    for trial in range(150):
        n, k, stride = int(rng.integers(140_000, 400_000)), int(rng.integers(65, 400)), int(rng.integers(1, 33))
        x = kinds[trial % len(kinds)](n).astype(np.float32)
        s = x[::stride]
        want = np.sort(np.partition(s, s.shape[0] - k)[s.shape[0] - k :])[::-1]
        got = sampler_fused.sample_top(x, stride, k)
        assert np.array_equal(got, want), trial
        used += s.shape[0] > sampler_fused._BINS_S
    assert used >= 100
    with_nan = _rows()[2].copy()
    with_nan[64] = np.nan
    out = np.empty(257, dtype=np.float32)
    assert not built_kernel().sample_top(with_nan, 32, out)  # (numpy's order for a NaN)
