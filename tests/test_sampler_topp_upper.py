"""Top-p's bins over the upper bins alone (issue 24, 2026-12-06, chain17): where top_p_deep's bins run over
every candidate of a long row (Gemma's flat rows under a JSON schema: ~250,000 candidates, 3-14% kept), the
kernel's top_p_cut adds the masses of the bins from a floor taken from the strided sample upwards only, and
splits those positions only. Its answer is the bins' over every position, bit for bit (the kept positions in
their order, the cut position after them, the kept mass), whether the floor held the cut bin (the upper bins
answered) or not (a sample that missed the mass: the bins over every position answered)."""

from __future__ import annotations

import numpy as np
from sampler_paths import built_kernel


def _rows() -> dict[str, np.ndarray]:
    """Long rows: a flat one (a normal body), one like Gemma's T 2 rows (a long upper tail), a coarse grid
    (ties within and across bins), one whose sampled positions (every 32nd) alone are raised (the floor
    from the sample too high: the bins over every position answer), and lengths around the floor of 131,072 where the upper bins are tried."""
    rng = np.random.default_rng(1717)
    n = 262_144
    out = {"flat": (rng.standard_normal(n) * 0.3).astype(np.float32)}
    x = rng.standard_normal(n).astype(np.float32) * 1.5
    tail = rng.random(n) < 0.06
    x[tail] += rng.exponential(2.5, size=int(tail.sum())).astype(np.float32)
    out["tail"] = x
    out["coarse"] = np.round(rng.standard_normal(n) * 3.0).astype(np.float32) / 2
    x = rng.standard_normal(n).astype(np.float32)
    x[::32] += 3.0  # (the sample alone raised: it puts the mass in bins the body's 31/32 are not in)
    out["sampled"] = x
    out["short"] = (rng.standard_normal(131_071) * 0.5).astype(np.float32)
    out["at_floor"] = (rng.standard_normal(131_072) * 0.5).astype(np.float32)
    return out


def test_the_upper_bins_answer_as_the_bins_over_every_position() -> None:
    k = built_kernel()
    answered: dict[str, set[bool]] = {}
    for name, x in _rows().items():
        n = x.shape[0]
        q = np.exp(x.astype(np.float64) - float(x.max()))
        total = float(q.sum())
        for p in (0.05, 0.3, 0.5, 0.8, 0.9, 0.95, 0.98, 0.999):
            got = []
            for share in (0.0, p):
                idx, kept = np.empty(n, np.int32), np.full(n, -7, np.int64)
                r = k.top_p_cut(x, q, p * total, 2048, idx, kept, share)
                got.append((r[0], float(r[1]).hex(), kept[: min(r[0] + 1, n)].tobytes()))
                if share:
                    answered.setdefault(name, set()).add(bool(r[2]))
            assert got[0] == got[1], (name, p)
    assert answered["flat"] >= {True} and answered["tail"] >= {True} and answered["coarse"] >= {True}, answered
    assert answered["sampled"] >= {False} and answered["short"] == {False} and answered["at_floor"] >= {True}, answered
