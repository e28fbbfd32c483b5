"""The stages' reports: what each stage removed and the mass it held, recomputed from the
definition in docs/trace-format.md ("Sampler stages") with a plain full sort in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loopchat.engine import dry, sampler
from loopchat.engine.sampler_stages import chain_for
from loopchat.settings import SamplingSettings


def S(**kw: float) -> SamplingSettings:
    return SamplingSettings(**{"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0, **kw})


def documented_reports(logits: np.ndarray, recent: list[int], s: SamplingSettings) -> list[tuple[str, int, float]]:
    """(stage, removed, removed_mass) as documented: masses in the softmax at temperature 1
    of the logits after the repeat penalty and DRY, over the whole vocabulary."""
    work = logits.copy()  # the penalties in float32, as the logits come from llama.cpp
    for t in set(recent[-s.repeat_last_n :]) if s.repeat_penalty != 1.0 and s.repeat_last_n > 0 else ():
        work[t] = work[t] / np.float32(s.repeat_penalty) if work[t] > 0 else work[t] * np.float32(s.repeat_penalty)
    ids, pen = dry.step_penalties(recent, s, len(work))  # DRY's own tests check these (test_dry.py)
    work[ids] -= pen
    w = work.astype(np.float64)
    p = np.exp(w - w.max())
    p /= p.sum()
    order = np.argsort(-w, kind="stable")
    out = [("repeat_penalty", 0, 0.0), ("dry", 0, 0.0)]

    def cut(name: str, keep: np.ndarray) -> np.ndarray:
        out.append((name, len(order) - len(keep), float(p[order[len(keep) :]].sum())))
        return keep

    if s.temperature == 0:
        cut("greedy", order[:1])
        return out
    order = cut("top_k", order[: s.top_k] if s.top_k > 0 else order)
    if s.top_p < 1.0:
        q = p[order] / p[order].sum()
        order = cut("top_p", order[: int(np.searchsorted(np.cumsum(q), s.top_p, side="left")) + 1])
    else:
        cut("top_p", order)
    order = cut("min_p", order[w[order] >= w[order[0]] + math.log(s.min_p)] if s.min_p > 0 else order)
    cut("temperature", order)
    return out


GRID = [
    S(),
    SamplingSettings(),
    S(top_k=1),
    S(top_k=40, temperature=0.7),
    S(top_p=0.9),
    S(top_p=0.5, min_p=0.05),
    S(min_p=0.1, temperature=2.0),
    S(min_p=0.001),
    S(top_k=3000, top_p=0.99),
    S(top_k=3000, min_p=0.02),
    S(top_k=40, top_p=0.8, min_p=0.2, repeat_penalty=1.3),
    S(repeat_penalty=0.7, top_p=0.95),
    S(min_p=0.01, repeat_penalty=1.3),
    S(top_p=0.999, min_p=0.01, repeat_penalty=1.3),
    S(temperature=0.0),
    S(temperature=0.0, repeat_penalty=1.5, top_k=40),
    S(dry_multiplier=0.8, top_p=0.9),
    S(dry_multiplier=2.0, dry_allowed_length=1, repeat_penalty=1.2, min_p=0.05),
]


@pytest.mark.parametrize("n", [4000, 262_144])
@pytest.mark.parametrize("settings", GRID)
def test_each_stage_reports_what_it_removed_and_the_mass_it_held(n: int, settings: SamplingSettings) -> None:
    rng = np.random.default_rng(n)
    logits = (rng.standard_normal(n) * 2.5).astype(np.float32)
    logits[rng.choice(n, 30, replace=False)] += 6.0  # a head of likely tokens, as real logits have
    head = [int(i) for i in np.argsort(-logits)[:8]]
    recent = head + [3, 3, 7] + head[:3]  # ends as it began: DRY penalises head[3], a likely token
    res = sampler.sample(logits, recent, settings, sampler.make_rng(0), report_k=10)
    want = documented_reports(logits, recent, settings)
    assert [r.stage for r in res.stages] == [name for name, _, _ in want]
    assert [r.stage for r in res.stages] == [st.name for st in chain_for(settings)]
    for r, (name, removed, mass) in zip(res.stages, want):
        assert r.removed == removed, name
        assert r.removed_mass == pytest.approx(mass, abs=1e-6), name
    # they add up: the counts to what the draw saw, the masses to 1
    left, held = n, 1.0
    for r in res.stages:
        left, held = left - r.removed, held - r.removed_mass
        assert (r.kept, r.kept_mass) == (left, pytest.approx(held, abs=1e-12))
    assert left == res.kept


def test_top_k_1_removes_all_but_the_top_token_and_the_mass_it_did_not_hold() -> None:
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal(49_152) * 3).astype(np.float32)
    res = sampler.sample(logits, [], S(top_k=1), sampler.make_rng(0))
    top_k = res.stages[2]
    assert (top_k.stage, top_k.removed, top_k.kept) == ("top_k", 49_151, 1)
    assert top_k.removed_mass == pytest.approx(1.0 - res.raw_top_probs[0], abs=1e-12)
    assert res.token_id == res.raw_top_ids[0] and res.kept == 1
    # the stages after it have nothing left to remove
    assert [(r.removed, r.removed_mass) for r in res.stages[3:]] == [(0, 0.0)] * 3


def test_a_stage_that_is_off_passes_everything_on() -> None:
    logits = np.random.default_rng(4).standard_normal(5000).astype(np.float32)
    res = sampler.sample(logits, [1, 2, 3], S(), sampler.make_rng(0))
    assert [(r.stage, r.removed, r.removed_mass, r.kept, r.kept_mass) for r in res.stages] == [
        (name, 0, 0.0, 5000, 1.0) for name in ("repeat_penalty", "dry", "top_k", "top_p", "min_p", "temperature")
    ]
