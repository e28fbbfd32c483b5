"""Top-p over the whole vocabulary without its float64 exp of every logit (sampler_raw's bound,
sampler_math.top_p_bounded): the raw pass's float64 sum of its float32 exps (the kernel's
raw_sums64), the bound on the exact total that sum gives, and the chain that uses it: the
same tokens and numbers as tests/reference_sampler.py, with the full float64 pass skipped
wherever the bound decides the cut, and taken (the same numbers again) where it does not."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sampler_paths import built_kernel, sampler_path  # noqa: F401 (a fixture)
from test_sampler_chain import S, reference, same
from test_sampler_raw import adversarial_rows, bits

from loopchat.engine import sampler, sampler_fused, sampler_raw


def exact_total(row: np.ndarray) -> float:
    """The sum of exp(float64(logit) - max), each exp rounded once, added exactly."""
    return math.fsum(np.exp(row.astype(np.float64) - float(row.max())).tolist())


def shaped_rows() -> list[np.ndarray]:
    """Rows shaped like both models' on a flat text (a few thousand plausible tokens around 0,
    the rest of the vocabulary far below), at their vocabulary sizes."""
    rng = np.random.default_rng(5)
    rows = []
    for n, plausible, spread in ((49_152, 3_000, 1.5), (49_152, 600, 2.5), (262_144, 5_000, 2.0), (262_144, 900, 3.0)):
        row = (rng.standard_normal(n) * 1.5 - 10.0).astype(np.float32)
        row[rng.choice(n, plausible, replace=False)] = (rng.standard_normal(plausible) * spread).astype(np.float32)
        rows.append(row)
    return rows


def test_raw_sums64_is_raw_sums_and_the_float64_sum_of_the_same_exps() -> None:
    k = built_kernel()
    for row in [*adversarial_rows().values(), *shaped_rows()]:
        if not np.isfinite(row.max()):
            continue
        m = float(row.max())
        total, dot, sum64 = k.raw_sums64(row, m)
        want_total, want_dot = k.raw_sums(row, m)
        assert bits(total) == bits(want_total) and bits(dot) == bits(want_dot)
        with np.errstate(invalid="ignore"):
            e = np.exp(row - np.float32(m))  # (numpy's float32 exps: the pass's, bit for bit)
        assert sum64 == pytest.approx(math.fsum(e.astype(np.float64).tolist()), rel=1e-13, abs=1e-300)


@pytest.mark.usefixtures("sampler_path")
def test_the_bound_holds_and_is_tight() -> None:
    """|X - the exact total| <= E on every row (both paths: the kernel's sum64, numpy's sum of
    its stored exps), and E within 2e-6 of X on real-shaped rows (what lets it decide)."""
    rows = {**adversarial_rows(), **{f"shaped{i}": r for i, r in enumerate(shaped_rows())}}
    for name, row in rows.items():
        mx = float(row.max())
        if not math.isfinite(mx):
            continue
        with np.errstate(invalid="ignore"):
            raw = sampler_raw.raw_softmax(row, mx, True)
        bound = raw.bound()
        if bound is None:  # (a -inf logit: dot is NaN, no bound)
            assert not math.isfinite(raw.dot), name
            continue
        x, err = bound
        assert abs(x - exact_total(row)) <= err, name
        if name.startswith("shaped"):
            assert err <= 2e-6 * x, (name, err / x)


def worst_settings(top_p: float, dry: bool = False) -> list:
    """The sweep's worst combination (top-k off, top-p, temperature 2, a repeat penalty) and
    one with min-p; `dry`: with DRY on and a logit bias that moves the most likely token too
    (stages the reference does not have)."""
    settings = [
        S(top_p=top_p, temperature=2.0, repeat_penalty=1.1),
        S(top_p=top_p, temperature=0.7, min_p=0.05, repeat_penalty=1.3),
    ]
    if dry:
        settings.append(S(top_p=top_p, temperature=2.0, dry_multiplier=0.8, dry_penalty_last_n=2048))
        settings.append(S(top_p=top_p, logit_bias=((3, -30.0), (11, 4.0), (12, 9.0))))
    return settings


@pytest.mark.usefixtures("sampler_path")
def test_top_p_skips_the_float64_pass_where_the_bound_decides_and_keeps_the_same_tokens(monkeypatch) -> None:
    """The chain against the reference on real-shaped rows, each step with a context (the
    penalties move the total), at top-p 0.5-0.99: every field the same (ids exactly, floats
    to 1e-9), and the vocabulary's float64 exp pass (exp_sum_above) run on few of the steps
    (on main: on every one)."""
    calls: list[int] = []
    real = sampler_fused.exp_sum_above
    monkeypatch.setattr(sampler_fused, "exp_sum_above", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(8)
    steps = 0
    for row in shaped_rows():
        context = [int(t) for t in rng.choice(row.shape[0], 300)] + [int(np.argmax(row))]
        for top_p in (0.5, 0.9, 0.95, 0.99):
            for s in worst_settings(top_p):
                old = reference.sample(row, context, s, reference.make_rng(4), 40)
                same(old, sampler.sample(row, context, s, sampler.make_rng(4), 40))
                steps += 1
    assert len(calls) <= steps // 4, (len(calls), steps)


@pytest.mark.usefixtures("sampler_path")
def test_where_the_bound_leaves_the_cut_open_the_full_pass_decides(monkeypatch) -> None:
    """A bound too wide to decide anything (forced): every step takes the full pass (exp_sum_above, alone
    or in the kernel's one call for top-p's search), and reports what the bounded steps report (with DRY
    and a logit bias too)."""
    rows = shaped_rows()
    settings = [s for p in (0.9, 0.95) for s in worst_settings(p, dry=True)]
    context = [1, 2, 3, 1, 2, 3, 1, 2]
    bounded = [sampler.sample(r, context, s, sampler.make_rng(2), 40) for r in rows for s in settings]
    monkeypatch.setattr(sampler_raw.RawSoftmax, "bound", lambda self: (self.sum64, 0.25 * self.sum64))
    calls: list[int] = []
    real, one_call = sampler_fused.exp_sum_above, sampler_fused.top_p_deep
    monkeypatch.setattr(sampler_fused, "exp_sum_above", lambda *a: calls.append(1) or real(*a))

    def top_p_deep(*a):  # type: ignore[no-untyped-def]
        out = one_call(*a)  # (the kernel's one call for the search makes the full pass, exp_sum_above's)
        if out is not None:
            calls.append(1)
        return out

    monkeypatch.setattr(sampler_fused, "top_p_deep", top_p_deep)
    wide = [sampler.sample(r, context, s, sampler.make_rng(2), 40) for r in rows for s in settings]
    for a, b in zip(bounded, wide, strict=True):
        for name in a.__slots__:  # (bit for bit: the same tokens kept, the same passes after)
            x, y = getattr(a, name), getattr(b, name)
            if name == "stages":
                assert x == y
            elif name != "basis":
                assert np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y, name
    assert len(calls) >= len(wide) // 2
