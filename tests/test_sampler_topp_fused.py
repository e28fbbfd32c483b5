"""Top-p's search over a large vocabulary in one call of the kernel (issue 24, 2026-12-06, chain10):
sampler_math's _deep_sample and _top_p_deep (the deep set's threshold from the strided sample, the
pass for the total and the deep set, the head's test and cut, numpy's pairwise sums of the masses,
the bins inside the deep set or over everything) as the kernel's top_p_deep. Its answer is the
steps' own, bit for bit: the kept positions in their order, the kept mass, the total, and what the
search hands top-p's cut token (`inside`), on rows made to end at each of its exits, with the masses
computed or read (the constraint's stored exps), on one thread and two."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
from sampler_paths import built_kernel

from loopchat.engine import sampler_fused, sampler_math


@pytest.fixture
def kernel_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sampler_fused, "kernel", built_kernel())
    yield
    sampler_fused.use_threads(1)


def _rows() -> dict[str, np.ndarray]:
    """Rows for each exit: one token far above the rest (the most likely alone), a few well above
    (the head's cut), a head that holds the target only past its 64th (the bins after the head's
    test), a coarse grid (ties among the 65 largest: the head left to numpy's order), a flat row (the
    bins inside the deep set, or over everything), -inf over most of it (non-finite logits in the deep
    set: numpy's bins), a NaN (numpy's steps from the sample on), and the sizes around the deep set's
    floor (32,768: no deep set at or below it)."""
    rng = np.random.default_rng(2612)
    n = 49_157
    out = {}
    x = rng.standard_normal(n).astype(np.float32)
    x[77] += 40.0
    out["sharp"] = x
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.choice(n, 12, replace=False)] += 9.0
    out["few"] = x
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.choice(n, 90, replace=False)] += 7.0
    out["head_short"] = x
    out["coarse"] = (np.round(rng.standard_normal(n) * 2.0) + np.where(rng.random(n) < 0.002, 9.0, 0.0)).astype(
        np.float32
    )
    out["flat"] = (rng.standard_normal(262_147) * 0.3).astype(np.float32)
    out["smooth"] = (rng.standard_normal(n) * 2.0).astype(np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.random(n) < 0.9] = -np.inf
    out["-inf"] = x
    x = rng.standard_normal(n).astype(np.float32)
    x[64] = np.nan
    out["nan"] = x
    out["floor"] = rng.standard_normal(32_768).astype(np.float32)
    out["above_floor"] = rng.standard_normal(32_769).astype(np.float32)
    return out


ROWS = _rows()


@contextlib.contextmanager
def _exits_into(exits: set[str]) -> Iterator[None]:
    """sampler_fused.top_p_deep spied on while inside: each call's exit ("none": its steps decide) into `exits`."""
    real = sampler_fused.top_p_deep

    def spy(*args: object) -> tuple | None:
        r = real(*args)  # type: ignore[arg-type]
        exits.add("none" if r is None else r[0])
        return r

    sampler_fused.top_p_deep = spy  # type: ignore[assignment]
    try:
        yield
    finally:
        sampler_fused.top_p_deep = real  # type: ignore[assignment]


def _same(a: object, b: object) -> bool:
    """Equal to the bit: arrays by dtype and bytes, floats by their bits, tuples and lists item by item."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return float(a).hex() == float(b).hex()  # type: ignore[arg-type]
    return bool(a == b)


def _steps(x: np.ndarray, cand: np.ndarray | None, p: float, exps: np.ndarray | None) -> tuple | None:
    """_deep_sample and _top_p_deep's own steps (the kernel's passes one by one): (kept, mass, total,
    inside), or None where there is no deep set."""
    above = sampler_math._deep_sample(x)
    if above is None:
        return None
    inside: list = []
    kept, mass, total = sampler_math._top_p_deep(x, cand, p, float(x.max()), above, inside, exps)
    return kept.copy(), mass, total, [tuple(a.copy() if isinstance(a, np.ndarray) else a for a in t) for t in inside]


@pytest.mark.usefixtures("kernel_on")
@pytest.mark.parametrize("threads", [1, 2])
def test_top_p_s_search_in_one_call_is_its_steps_to_the_bit(threads: int) -> None:
    sampler_fused.use_threads(threads)
    exits: set[str] = set()
    for name, x in ROWS.items():
        mx = float(np.nanmax(x)) if name != "nan" else float(x[0])
        cands = [None, np.arange(0, x.shape[0], dtype=np.intp)]
        for p in (0.05, 0.3, 0.5, 0.9, 0.95, 0.999, 0.99999):
            for stored in (False, True):
                exps = None
                if stored:
                    exps = np.empty(x.shape[0])
                    sampler_fused.exp_sum(x, mx, exps)
                want = _steps(x, cands[p > 0.9], p, exps)
                inside: list = []
                with _exits_into(exits):
                    got = sampler_math._top_p_fused(x, cands[p > 0.9], p, mx, inside, exps)
                if got is None:
                    assert want is None or name == "nan", (name, p)
                    continue
                assert want is not None, (name, p)
                assert _same((got[0], got[1], got[2]), want[:3]), (name, p, stored)
                assert _same(inside, want[3]), (name, p, stored)
    assert exits == {"none", "first", "rest", "head", "deep", "all"}, exits


def test_numpys_pairwise_sum_is_the_kernels_for_the_head_and_the_deep_set() -> None:
    """The head's test and the deep set's (numpy's q.sum(), pairwise: eight lanes up to 128, halves a
    multiple of eight above) decide which bins run: the kernel's sum is numpy's for every length up to
    300 and longer ones, on masses whose order of addition shows in the bits."""
    k = built_kernel()
    rng = np.random.default_rng(7)
    for n in [*range(300), 1023, 8191, 8192, 8193, 12_345, 262_147]:
        q = np.exp(rng.standard_normal(n) * 6.0)
        assert float(k.pairwise_sum(q)).hex() == float(q.sum()).hex(), n


@pytest.mark.usefixtures("kernel_on")
@pytest.mark.parametrize("threads", [1, 2])
def test_the_calls_top_of_the_kept_logits_is_top_k_s(threads: int) -> None:
    """Where the bins ran (inside the deep set or over everything), the top the call finds among the deep
    set, placed in the kept order by the split (chain12), is the kernel's top_k over the kept logits, given
    exactly where that answers (no tie among the want + 1 largest, enough kept), for a top of 1 to 256
    (257: none), the kept positions the steps' own."""
    sampler_fused.use_threads(threads)
    rng = np.random.default_rng(14)
    seen: set[str] = set()
    for name, x in ROWS.items():
        if name == "nan":
            continue
        mx = float(np.nanmax(x))
        shuffled = rng.permutation(x.shape[0] * 3)[: x.shape[0]].astype(np.int64)
        for p, want, cand, stored in [
            (p, w, c, s)
            for p in (0.3, 0.9, 0.95, 0.999)
            for w, c in ((11, None), (41, shuffled), (1, None), (256, shuffled), (257, None))
            for s in (False, True)
        ]:
            exps = None
            if stored:
                exps = np.empty(x.shape[0])
                sampler_fused.exp_sum(x, mx, exps)
            steps = _steps(x, cand, p, exps)
            top_out: list = [want]
            got = sampler_math._top_p_fused(x, cand, p, mx, [], exps, top_out)
            if got is None or len(top_out) == 1:  # (no call of the kernel's, or its steps' answer)
                continue
            assert steps is not None and _same(got[0], steps[0]), (name, p)
            top = top_out[1]
            how = sampler_fused.top_p_deep(x, mx, p, np.empty(x.shape[0]) if exps is None else exps, stored)
            assert how is not None
            answer = sampler_fused.top_k(x[steps[0]], want) if how[0] in ("deep", "all") else None
            if top is not None:
                seen.add(f"top {how[0]}")
                assert answer is not None and _same(top, answer), (name, p, want)
            else:
                assert answer is None, (name, p, want, how[0])
    assert seen == {"top all", "top deep"}, seen


@pytest.mark.usefixtures("kernel_on")
@pytest.mark.parametrize("threads", [1, 2])
def test_stored_exps_at_a_larger_shift_keep_the_same_candidates(threads: int) -> None:
    """The constraint's exps are at the raw max; where the candidates' largest logit is below it (the raw
    top forbidden or penalized), top-p's search reads them still (chain24), each mass times one factor: the
    kernel's unit is the most likely candidate's own mass. Its answer is that of the masses computed at the
    candidates' largest logit: the same kept positions in the same order, what it hands the cut token, and
    the kept share to 1e-12, at each exit (the most likely alone, the head, the bins inside the deep set
    and over everything, numpy's steps after a refusal), the raw max 0.7 to 30 above."""
    sampler_fused.use_threads(threads)
    exits: set[str] = set()
    for name, x in ROWS.items():
        if name == "nan":
            continue
        mx = float(np.nanmax(x))
        cand = np.arange(0, x.shape[0], dtype=np.intp)
        for p in (0.05, 0.3, 0.5, 0.9, 0.95, 0.999):
            inside: list = []
            want = sampler_math.top_p_positions(x, cand, p, mx, src=x, inside=inside)
            for gap in (0.7, 5.0, 30.0):
                exps = np.empty(x.shape[0])
                sampler_fused.exp_sum(x, mx + gap, exps)
                got_inside: list = []
                with _exits_into(exits):
                    got = sampler_math.top_p_positions(x, cand, p, mx, src=x, inside=got_inside, exps=exps, scaled=True)
                assert np.array_equal(got[0], want[0]), (name, p, gap)
                assert abs(got[1] - want[1]) <= 1e-12, (name, p, gap)
                assert _same(got_inside, inside), (name, p, gap)
    assert {"first", "head", "deep", "all", "rest"} <= exits, exits


@pytest.mark.usefixtures("kernel_on")
def test_the_scans_sample_is_the_strided_one() -> None:
    """Given src[::32] (the constraint's scan writes it beside src, chain24), the kernel's search reads it
    instead of src's strided values: the same answer to the bit, at every exit and length (a short last
    stride included); a sample of another length is refused."""
    for name, x in ROWS.items():
        mx = float(np.nanmax(x)) if name != "nan" else float(x[0])
        exps = np.empty(x.shape[0])
        sampler_fused.exp_sum(x, mx, exps)
        for p in (0.05, 0.5, 0.95, 0.999):
            for stored in (False, True):
                full = exps if stored else np.full(x.shape[0], np.nan)
                want = sampler_fused.top_p_deep(x, mx, p, full.copy(), stored, 11)
                want = None if want is None else _copied(want)
                got = sampler_fused.top_p_deep(x, mx, p, full.copy(), stored, 11, np.ascontiguousarray(x[::32]))
                assert _same(None if got is None else _copied(got), want), (name, p, stored)
    x = ROWS["smooth"]  # (the sample is what sets the deep set's threshold: another one, another deep set)
    lower = np.ascontiguousarray(x[::32]) - np.float32(0.5)
    a = sampler_fused.top_p_deep(x, float(x.max()), 0.9, np.empty(x.shape[0]), False, 11)
    a_nd = None if a is None else a[6][0].shape[0]
    b = sampler_fused.top_p_deep(x, float(x.max()), 0.9, np.empty(x.shape[0]), False, 11, lower)
    assert a is not None and b is not None and b[6][0].shape[0] > a_nd
    with pytest.raises(ValueError, match="sample"):
        sampler_fused.top_p_deep(x, float(x.max()), 0.9, np.empty(x.shape[0]), False, 11, x[:100].copy())


def _copied(r: tuple) -> tuple:
    """top_p_deep's answer with its views of scratch memory copied (the next call writes there)."""
    return tuple(
        tuple(a.copy() if isinstance(a, np.ndarray) else a for a in v)
        if isinstance(v, tuple)
        else (v.copy() if isinstance(v, np.ndarray) else v)
        for v in r
    )
