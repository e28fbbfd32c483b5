"""The sorted form's tail of the chain in Python floats: top-p, min-p, temperature, the
distribution sampled from and the draw, on the few candidates top-k left (`draw_sorted`).

sampler_stages' TopP, MinP and Temperature and sampler's sorted distribution and draw run
numpy on arrays of ~40 float64s: some thirty numpy calls a step, each mostly its own
overhead (~1-3 us a call right after a forward pass, the caches cold), where the arithmetic
is a few hundred float operations. Here the same operations run on Python floats, in the same
order, so the same numbers come out: numpy's float64 exp and log2 are the C library's on a CPU
without AVX-512 (math.exp, math.log2: `EXACT` checks it on a probe set at import, and this
tail is used only where every bit matched), cumsum and searchsorted are sequential sums and
binary searches (itertools.accumulate, bisect), and a sum is numpy's pairwise sum (`np_sum`,
its order of additions: tests/test_sampler_tail.py checks it against numpy). The stages'
reports are made by the same `Candidates.report`. sampler.sample takes this path for the
sorted form when the chain ends with top-p, min-p and temperature (chain_for's order) and no
token is forced; the chain's stages stay the definition (tests/test_sampler_chain.py runs
both against tests/reference_sampler.py).
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass

import numpy as np

from loopchat.engine.sampler_candidates import Candidates
from loopchat.engine.sampler_stages import MinP, Stage, Temperature, TopP
from loopchat.stage_report import StageReport

_BLOCK = 128  # numpy's PW_BLOCKSIZE: a pairwise sum's leaf


def np_sum(a: list[float]) -> float:
    """float(np.array(a).sum()) for float64 values: numpy's pairwise sum, its additions in its
    order (eight partial sums over a leaf of at most 128, halves split at a multiple of 8)."""
    n = len(a)
    if n < 8:
        res = 0.0
        for v in a:
            res += v
        return res
    if n <= _BLOCK:
        r = a[:8]
        end = n - n % 8
        for i in range(8, end, 8):
            r[0] += a[i]
            r[1] += a[i + 1]
            r[2] += a[i + 2]
            r[3] += a[i + 3]
            r[4] += a[i + 4]
            r[5] += a[i + 5]
            r[6] += a[i + 6]
            r[7] += a[i + 7]
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for i in range(end, n):
            res += a[i]
        return res
    half = n // 2
    half -= half % 8
    return np_sum(a[:half]) + np_sum(a[half:])


def _probe() -> bool:
    """Whether numpy's float64 exp and log2 give math's bits here (a sweep of the arguments the
    tail takes: exp of 0 down to -800, log2 of (0, 1]; and special values)."""
    x = np.concatenate([-np.geomspace(1e-12, 800.0, 4001), np.linspace(-745.5, 0.0, 4001), [0.0, -0.0, -np.inf]])
    with np.errstate(all="ignore"):
        e = np.exp(x)
        if e.tobytes() != np.array([math.exp(v) for v in x.tolist()]).tobytes():
            return False
        p = e[e > 0]
        return bool(np.log2(p).tobytes() == np.array([math.log2(v) for v in p.tolist()]).tobytes())


#: numpy's float64 exp and log2 are math's here, bit for bit: the tail gives the stages' numbers
EXACT = _probe()


@dataclass(slots=True)
class TailDraw:
    """What the tail gave: the three stages' reports, the distribution drawn from (`probs`,
    normalised, in the candidates' order; its entropy in bits), the position drawn and its rank."""

    reports: list[StageReport]
    probs: list[float]
    entropy: float
    pick: int
    rank: int


def starts_at(chain: tuple[Stage, ...]) -> int:
    """Where the tail this module runs begins in `chain` (len(chain): it does not end with one)."""
    if len(chain) >= 3 and [type(s) for s in chain[-3:]] == [TopP, MinP, Temperature]:
        return len(chain) - 3
    return len(chain)


def draw_sorted(c: Candidates, tail: tuple[Stage, ...], rng: np.random.Generator) -> TailDraw | None:
    """The tail's stages (TopP, MinP, Temperature) on sorted candidates no stage has scaled yet,
    the distribution and the draw (rng.random() once, as sampler._draw). None: not this case (the
    unsorted form, an inexact exp here): the stages run as they are."""
    if not EXACT or not c.sorted or c.z is not None or c.t != 1.0 or c.logits64 is None or len(tail) != 3:
        return None
    top_p, min_p, temp = tail
    assert isinstance(top_p, TopP) and isinstance(min_p, MinP) and isinstance(temp, Temperature)
    logits = c.logits64.tolist()
    if not logits or not math.isfinite(logits[0]):  # (an infinite top: numpy's NaN rules decide)
        return None
    l0 = logits[0]
    e: list[float] | None = None  # exp(l - l[0]) (top-p's, then min-p's)
    reports = []
    entered = len(logits)
    if top_p.p >= 1.0 or entered <= 1:
        reports.append(c.report(top_p.name, entered, c.mass))
    else:
        e = [math.exp(v - l0) for v in logits]
        cum = list(itertools.accumulate(e))
        last = cum[-1]
        cum = [v / last for v in cum]
        n_keep = min(max(bisect.bisect_left(cum, top_p.p) + 1, 1), entered)
        cut = int(c.ids[n_keep]) if n_keep < entered else -1  # type: ignore[index]
        c.keep_first(n_keep)
        logits, e = logits[:n_keep], e[:n_keep]
        reports.append(c.report(top_p.name, entered, c.mass * cum[n_keep - 1], cut))
    reports.append(_min_p(c, min_p, logits, e))
    logits = logits[: c.count]
    reports.append(c.report(temp.name, c.count, c.mass))
    t = temp.t
    z = [v - l0 for v in logits] if t == 1.0 else [(v - l0) / t for v in logits]
    w = [math.exp(v) for v in z]
    s = np_sum(w)
    probs = [v / s for v in w]
    nz = [p * math.log2(p) for p in probs if p > 0]
    entropy = -np_sum(nz) if len(nz) > 1 else 0.0
    n = len(probs)
    pick = 0 if n == 1 else min(bisect.bisect_right(list(itertools.accumulate(probs)), rng.random()), n - 1)
    pw = probs[pick]
    rank = 1 + sum(1 for v in probs[:pick] if v > pw)
    return TailDraw(reports, probs, entropy, pick, rank)


def _min_p(c: Candidates, stage: MinP, logits: list[float], e: list[float] | None) -> StageReport:
    """MinP.apply on the sorted candidates (`logits`: theirs; `e`: exp(l - l[0]) if top-p made it)."""
    entered = c.count
    if stage.min_p <= 0.0 or entered <= 1:
        return c.report(stage.name, entered, c.mass)
    floor = logits[0] + math.log(stage.min_p)
    n_keep = max(sum(1 for v in logits if v >= floor), 1)
    if n_keep == entered:
        return c.report(stage.name, entered, c.mass)
    w = e if e is not None else [math.exp(v - logits[0]) for v in logits]
    cut = int(c.ids[n_keep])  # type: ignore[index]
    c.keep_first(n_keep)
    return c.report(stage.name, entered, c.mass * np_sum(w[:n_keep]) / np_sum(w), cut)
