"""Every token kept, the distribution's weights are not stored (sampler_fused's
distribution_sums; the kernel's distribution with weights None): the same sums as the pass
that stores them, the few weights a report or the draw needs recomputed as that pass
computes them (weights_of), and the drawn token's rank counted over the float32 logits
the weights come from: the same rank as a count over the weights, and the weights
computed whole where that could differ (tiny logits, underflow, -inf). On both paths
(tests/sampler_paths.py); the chain against the reference: tests/test_sampler_chain.py and
test_sampler_kernel.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import test_sampler_chain as chain
from sampler_paths import sampler_path  # noqa: F401 (a fixture)
from test_sampler_kernel import ROWS, close, ulps

from loopchat.engine import sampler, sampler_distribution, sampler_fused, sampler_math
from loopchat.engine.sampler import _sampled_rank
from loopchat.engine.sampler_distribution import Distribution

pytestmark = pytest.mark.usefixtures("sampler_path")


@pytest.mark.parametrize("name", list(ROWS))
@pytest.mark.parametrize("t", [1.0, 0.7, 2.0])
def test_the_sums_without_the_weights_are_the_sums_with_them(name: str, t: float) -> None:
    x = ROWS[name]
    mx = float(x.max())
    w, blocks, norm, wz = (
        a.copy() if isinstance(a, np.ndarray) else a for a in sampler_fused.distribution(x, mx, t, 1024)
    )
    s_blocks, s_norm, s_wz = sampler_fused.distribution_sums(x, mx, t, 1024)
    assert s_blocks.shape == blocks.shape and np.allclose(s_blocks, blocks, rtol=1e-11, atol=0)
    assert close(s_norm, norm)
    assert (np.isnan(wz) and np.isnan(s_wz)) or abs(s_wz - wz) <= 1e-11 * max(abs(wz), norm)
    # a block's weights (the draw's) and a gathered few (the reports'), recomputed
    n = x.shape[0]
    for first in {0, 1024 * (n // 2048), 1024 * ((n - 1) // 1024)}:
        got = sampler_fused.weights_of(x[first : first + 1024], mx, t)
        assert np.array_equal(got == 0, w[first : first + 1024] == 0)
        pos = got > 0
        assert np.all(ulps(got[pos], w[first : first + 1024][pos]) <= 2.0)
    ids = np.array(sorted({0, n // 3, n - 1, int(np.argmax(x)), int(np.argmin(x))}))
    got = sampler_fused.weights_of(x[ids], mx, t)
    pos = got > 0
    assert np.array_equal(got == 0, w[ids] == 0) and np.all(ulps(got[pos], w[ids][pos]) <= 2.0)


def lazy(x: np.ndarray, t: float) -> Distribution:
    """The unsorted distribution of every token of x, its weights not stored (as the chain
    makes it with a penalty: its top from the logits)."""
    mx = float(x.max())
    blocks, norm, _ = sampler_fused.distribution_sums(x, mx, t, sampler.DRAW_BLOCK)
    top = sampler.top_indices(x, 10)
    return Distribution(None, None, norm, 0.0, top, blocks, x.shape[0], x, mx, t)


def tricky_row() -> np.ndarray:
    """Logits a rank over them could get wrong: near 0 (adjacent float32 values whose
    weights may round together), far below the max (underflow), -inf, ties."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(5000) * 3).astype(np.float32)
    x[:40] = np.float32(1e-30) * np.arange(40, dtype=np.float32)  # tiny, distinct
    x[40:60] = np.float32(-2e-4)
    x[60:80] = -np.inf
    x[80:100] = -1000.0 - np.arange(20, dtype=np.float32)  # distinct; exp underflows at t <= 1.4
    x[100:110] = x[200]  # equal ones
    return x


@pytest.mark.parametrize("t", [1.0, 0.7, 2.0])
def test_the_rank_over_the_logits_is_the_rank_over_the_weights(t: float) -> None:
    x = tricky_row()
    for pick in [*range(0, 120, 3), 200, 4999, int(np.argmin(x)), int(np.argmax(x))]:
        d = lazy(x, t)
        weights = sampler_fused.distribution(x, d.shift, t, sampler.DRAW_BLOCK)[0].copy()
        pick_weight = float(d.weights(np.array([pick]))[0])
        got = _sampled_rank(d, pick, pick_weight, d.weights(d.top))
        assert got == int(np.count_nonzero(weights > weights[pick])) + 1, pick


@pytest.mark.parametrize("t", [1.0, 0.7, 2.0])
def test_the_chain_without_stored_weights_gives_what_the_reference_gives(t: float) -> None:
    """The whole step, every token kept with a penalty (the form without stored weights),
    against tests/reference_sampler.py (which stores them): every field to 1e-9."""
    x = tricky_row()
    x[60:80] = -30.0  # (finite: with -inf the entropy is NaN, in the reference as here)
    rows = [(x, [200, 4999, 7, 11, 0, 3])]
    for penalty in (1.2, 0.8):
        settings = chain.S(temperature=t, repeat_penalty=penalty)
        for report_k in (1, 10, 40):
            chain.compare(rows, settings, report_k, seeds=tuple(range(8)))


@pytest.mark.parametrize("name", [n for n in ROWS if n != "-inf"])
def test_top_p_without_stored_masses_keeps_what_it_keeps_with_them(name: str) -> None:
    """top_p_positions given an estimate of the total (the chain's float32 mass unit) sums the
    vocabulary's masses without storing them where the head or the deep set holds top_p:
    the same tokens and share as the pass that stores them, also when the estimate is
    wrong (too small: not stored, then the masses computed after all where the exact
    target is not held; too large: stored from the start)."""
    x = ROWS[name].copy()
    if name == "spread":
        x *= 2.5  # (sharper: the cut-off in the head, the deep set, or the bins, by top_p)
    mx = float(x.max())
    true_total = float(np.exp(x.astype(np.float64) - mx).sum())
    for top_p in (0.3, 0.9, 0.95, 0.99, 0.999):
        want_ids, want_share = sampler_math.top_p_positions(x, None, top_p, mx)
        want_ids = want_ids.copy()  # (the bins' kept positions are scratch memory: the next call's)
        for estimate in (true_total, true_total * (1 + 3e-6), true_total * 1e3, true_total * 1e-3):
            ids, share = sampler_math.top_p_positions(x, None, top_p, mx, (estimate * math.exp(1.5), mx - 1.5))
            assert np.array_equal(np.sort(ids), np.sort(want_ids)), (top_p, estimate)
            assert abs(share - want_share) <= 1e-12, (top_p, estimate)


def _many_candidates_rows() -> dict[str, np.ndarray]:
    """Rows whose chain leaves many unsorted candidates (top-k 5,000): spread logits, coarse ones
    (ties across the reported top's cut), and tiny distinct logits next to a large one (two
    logits, one float64 weight: exp((1e-30 - 10) / t) = exp((2e-30 - 10) / t))."""
    rng = np.random.default_rng(14)
    n = 60_000
    spread = (rng.standard_normal(n) * 3).astype(np.float32)
    coarse = np.round(rng.standard_normal(n) * 2).astype(np.float32)
    collide = np.full(n, -30.0, dtype=np.float32)
    collide[rng.choice(n, 6000, replace=False)] = -25.0
    collide[7] = 10.0
    collide[100:140] = np.arange(1, 41, dtype=np.float32) * np.float32(1e-30)
    return {"spread": spread, "coarse": coarse, "collide": collide}


@pytest.mark.parametrize("name", ["spread", "coarse", "collide"])
def test_many_candidates_weights_are_not_stored_where_their_logits_order_them(name: str, monkeypatch) -> None:
    """More than 1,024 candidates of a subset (top-k 5,000 here; a JSON schema's ~250,000 on Gemma):
    the distribution's reported top is found among the float32 logits, its weights not stored,
    where that is top_indices of the weights' answer (sampler_distribution.top_by_logits); every figure, the
    token drawn, the reported top and a forced token's rank are what the stored weights give; and
    the weights are stored where the logits cannot tell (coarse logits tied across the cut, the
    tiny logits)."""
    x = _many_candidates_rows()[name]
    settings = sampler.SamplingSettings().replace(top_k=5000, top_p=1.0, min_p=0.0, temperature=2.0, seed=3)
    stored: list[int] = []
    real = sampler_fused.distribution
    monkeypatch.setattr(sampler_fused, "distribution", lambda a, *r: stored.append(a.shape[0]) or real(a, *r))

    def run() -> list:
        out = []
        for force in (None, int(np.argsort(-x, kind="stable")[2500])):
            r = sampler.sample(x, [1, 2], settings, sampler.make_rng(4), 10, force=force)
            out.append((r.token_id, r.sampled_top_ids.tolist(), r.sampled_top_probs.tobytes(), r.sampled_prob))
            out.append((r.sampled_rank, r.sampled_entropy, r.kept, r.stages))
        return out

    got = run()
    stored_now, stored[:] = list(stored), []
    monkeypatch.setattr(sampler_distribution, "top_by_logits", lambda *a: None)
    assert run() == got
    assert 5000 in stored  # (the patch took: the weights were stored this time)
    if sampler_fused.kernel is not None:  # (numpy's distribution_sums stores them all the same)
        assert (5000 in stored_now) == (name != "spread"), stored_now
