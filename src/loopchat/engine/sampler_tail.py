"""The sorted form's tail of the chain in Python floats: top-p, min-p, temperature, the
distribution sampled from and the draw, on the few candidates top-k left (`draw_sorted`).

sampler_stages' TopP, MinP and Temperature and sampler's sorted distribution and draw run
numpy on arrays of ~40 float64s: some thirty numpy calls a step, each mostly its own
overhead (~1-3 us a call right after a forward pass, the caches cold), where the arithmetic
is a few hundred float operations. Here the same operations run on Python floats, in the same
order, so the same numbers come out, but for the exps and the log2s: those are numpy's, taken
in one call each on the tail's candidates (numpy's float64 exp and log2 are the C library's on
some CPUs and numpy's own AVX-512 code on others: an element's result does not depend on the
array it is in, so numpy's bits whatever the CPU). cumsum and searchsorted are sequential sums
and binary searches (itertools.accumulate, bisect), and a sum is numpy's pairwise sum (`np_sum`,
its order of additions, sampler_pairwise: tests/test_sampler_tail.py checks it against numpy). The
distribution, its entropy and the draw (`_figures_floats`: a loop over the candidates each) run in
the C kernel where it is built (`_figures_kernel`: tail_norm and tail_draw around numpy's one log2
call, the same operations in the same order, so the same bits: tested against the floats). The stages'
reports are made by the same `Candidates.report`. sampler.sample takes this path for the
sorted form when the chain ends with top-p, min-p and temperature (chain_for's order) and no
token is forced, and for min-p and temperature where top-p ran as a stage over the unsorted
form (top-k off) and sorted the few it kept; the chain's stages stay the definition (tests/test_sampler_chain.py runs
both against tests/reference_sampler.py).
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass

import numpy as np

from loopchat.engine import sampler_fused
from loopchat.engine.sampler_candidates import Candidates
from loopchat.engine.sampler_pairwise import np_sum
from loopchat.engine.sampler_scratch import scratch
from loopchat.engine.sampler_stages import MinP, Stage, Temperature, TopP
from loopchat.stage_report import StageReport

#: the most candidates top-p over the unsorted form may leave for the tail to take min-p, temperature and
#: the draw in floats (its loops grow with them; numpy's calls cost the same for 50 as for 1,000)
AFTER_TOP_P = 256

#: the kernel's tail_norm and tail_draw (None: no kernel, or one built before them: the Python floats)
_TAIL = (
    (sampler_fused.kernel.tail_norm, sampler_fused.kernel.tail_draw)
    if sampler_fused.kernel is not None and hasattr(sampler_fused.kernel, "tail_draw")
    else None
)


@dataclass(slots=True)
class TailDraw:
    """What the tail gave: the three stages' reports, the distribution drawn from (`probs`,
    normalised, in the candidates' order; its entropy in bits), the position drawn and its rank."""

    reports: list[StageReport]
    probs: list[float] | np.ndarray
    entropy: float
    pick: int
    rank: int


def starts_at(chain: tuple[Stage, ...]) -> int:
    """Where the tail this module runs begins in `chain` (len(chain): it does not end with one)."""
    if len(chain) >= 3 and [type(s) for s in chain[-3:]] == [TopP, MinP, Temperature]:
        return len(chain) - 3
    return len(chain)


def draw_sorted(c: Candidates, tail: tuple[Stage, ...], rng: np.random.Generator) -> TailDraw | None:
    """The tail's stages (TopP, MinP, Temperature; or MinP and Temperature where top-p has run, over
    the unsorted form, and sorted the few it kept) on sorted candidates no stage has scaled yet, the
    distribution and the draw (rng.random() once, as sampler._draw). None: not this case (the
    unsorted form, an infinite top): the stages run as they are."""
    if not c.sorted or c.z is not None or c.t != 1.0 or c.logits64 is None or len(tail) not in (2, 3):
        return None
    # (chain_for's order: starts_at found them)
    top_p: TopP | None = tail[0] if len(tail) == 3 else None  # type: ignore[assignment]
    min_p: MinP = tail[-2]  # type: ignore[assignment]
    temp: Temperature = tail[-1]  # type: ignore[assignment]
    l64 = c.logits64
    entered = l64.shape[0]
    if not entered or not math.isfinite(l64[0]):  # (an infinite top: numpy's NaN rules decide)
        return None
    t = temp.t
    cuts = entered > 1 and ((top_p is not None and top_p.p < 1.0) or min_p.min_p > 0.0)
    known = c.sorted_exps
    if known is not None and known[0] is l64 and known[1] == l64[0]:
        # top-k's differences and exps (sorted_mass) are these: its shift, the raw max, is the top's logit
        d, e = known[2], known[3]
        w_all = e if t == 1.0 else np.exp(d / t)
        return _tail(c, (top_p, min_p, temp), l64, e if cuts or t == 1.0 else [], w_all, rng)
    d = l64 - l64[0]  # (the stages' `logits64 - logits64[0]`, and their z before the temperature)
    # every exp the tail takes, in one call: exp(d) (top-p's and min-p's, where they run) and
    # exp(d / t) (the distribution's, the kept ones a prefix of it)
    if t == 1.0:
        w_all = np.exp(d)
        e = w_all.tolist()
    elif cuts:
        both = np.exp(np.concatenate((d, d / t)))
        e, w_all = both[:entered].tolist(), both[entered:]
    else:
        e, w_all = [], np.exp(d / t)
    return _tail(c, (top_p, min_p, temp), l64, e, w_all, rng)


def _tail(
    c: Candidates,
    stages: tuple[TopP | None, MinP, Temperature],
    l64: np.ndarray,
    e: list,
    w_all: list | np.ndarray,
    rng: np.random.Generator,
) -> TailDraw:
    """draw_sorted's stages and draw, from exp(d) (`e`) and exp(d / t) (`w_all`); top-p None: run already."""
    top_p, min_p, temp = stages
    reports = [] if top_p is None else [_top_p(c, top_p, e)]
    reports.append(_min_p(c, min_p, l64, e))
    n = c.count
    reports.append(c.report(temp.name, n, c.mass))
    if n == 1:  # (no draw: the generator not used)
        w0 = float(w_all[0])
        return TailDraw(reports, [w0 / w0], 0.0, 0, 1)
    return TailDraw(reports, *(_figures_floats if _TAIL is None else _figures_kernel)(w_all[:n], rng))


def _figures_floats(w: list | np.ndarray, rng: np.random.Generator) -> tuple[list[float], float, int, int]:
    """_tail's distribution drawn from (the weights `w` over their numpy sum), its entropy in bits, the
    position drawn and its rank, in Python floats."""
    w = w if isinstance(w, list) else w.tolist()
    n, s = len(w), np_sum(w)
    probs = [v / s for v in w]
    nz = [p for p in probs if p > 0]
    entropy = -np_sum([p * q for p, q in zip(nz, np.log2(nz).tolist())]) if len(nz) > 1 else 0.0
    pick = min(bisect.bisect_right(list(itertools.accumulate(probs)), rng.random()), n - 1)
    pw = probs[pick]
    rank = 1 + sum(1 for v in probs[:pick] if v > pw) if pick else 1
    return probs, entropy, pick, rank


def _figures_kernel(w: list | np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, float, int, int]:
    """_figures_floats in the kernel's two calls around numpy's log2 (tail_norm, tail_draw: the same
    operations in the same order, the same bits), the distribution a fresh array: ~70 -> ~30 us a draw
    of ~70 candidates after a forward pass (docs/performance.md, twenty-sixth session)."""
    assert _TAIL is not None
    norm, draw = _TAIL
    w = np.asarray(w, dtype=np.float64)
    n = w.shape[0]
    probs, nz = np.empty(n), scratch.get("tail_nz", n, np.float64)
    _, k = norm(w, probs, nz)
    entropy, pick, rank = draw(probs, nz[:k], np.log2(nz[:k]), rng.random())
    return probs, entropy, pick, rank


def _top_p(c: Candidates, stage: TopP, e: list[float]) -> StageReport:
    """TopP.apply on the sorted candidates (`e`: exp(l - l[0]) of them: draw_sorted's)."""
    entered = c.count
    if stage.p >= 1.0 or entered <= 1:
        return c.report(stage.name, entered, c.mass)
    cum = list(itertools.accumulate(e))
    last = cum[-1]
    cum = [v / last for v in cum]
    n_keep = min(max(bisect.bisect_left(cum, stage.p) + 1, 1), entered)
    cut = int(c.ids[n_keep]) if n_keep < entered else -1  # type: ignore[index]
    c.keep_first(n_keep)
    return c.report(stage.name, entered, c.mass * cum[n_keep - 1], cut)


def _min_p(c: Candidates, stage: MinP, l64: np.ndarray, e: list[float]) -> StageReport:
    """MinP.apply on the sorted candidates (`l64`: their float64 logits before top-p, `e`: exp(l -
    l[0]) of them: draw_sorted's)."""
    entered = c.count
    if stage.min_p <= 0.0 or entered <= 1:
        return c.report(stage.name, entered, c.mass)
    floor = float(l64[0]) + math.log(stage.min_p)
    n_keep = max(sum(1 for v in l64[:entered].tolist() if v >= floor), 1)
    if n_keep == entered:
        return c.report(stage.name, entered, c.mass)
    cut = int(c.ids[n_keep])  # type: ignore[index]
    c.keep_first(n_keep)
    return c.report(stage.name, entered, c.mass * np_sum(e[:n_keep]) / np_sum(e[:entered]), cut)
