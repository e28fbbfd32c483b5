"""The sampler's stages: small objects, each narrowing the candidates and saying what it did.

The chain of a step is data, built from the settings in one place (`chain_for`), in
llama.cpp's order: repeat penalty -> DRY -> logit bias -> top-k -> top-p -> min-p ->
temperature; at temperature 0: repeat penalty -> DRY -> logit bias -> greedy. `sampler.sample`
runs it over a `Candidates`, then makes the distribution and draws. Every stage is in its
chain whatever its setting (one that is off passes everything on), but for the logit bias:
in the chain only when some token has one. Adding a stage is a class with a `name`
and `apply(c) -> StageReport`, and a line in `chain_for`.

A stage's report (StageReport, loopchat/stage_report.py) counts the candidates it removed
and the probability they held, and names the most likely of them, all stages measured in
one distribution: the softmax, at temperature 1, of the logits after the stages that change
logits (repeat penalty, DRY, logit bias), over the whole vocabulary (docs/trace-format.md,
"Sampler stages"). The removed masses of a step therefore add up: 1 minus their sum is
the last report's kept_mass. A stage that changes logits reports how many it changed and
the mass it moved (the total variation distance between the softmax before and after it).

The candidates take one of two forms, chosen for cost (see sampler_math): sorted (ids
largest logit first, at most SORT_LIMIT of them, with their float64 logits), or
unsorted (more than SORT_LIMIT; `ids` None for the whole vocabulary in id order), which
is never sorted whole. Top-k picks the form; top-p sorts what it leaves if few remain.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from loopchat.engine import dry, sampler_fused, sampler_penalized
from loopchat.engine.sampler_cuts import cut_after, cut_among, cut_below, top_and_cut
from loopchat.engine.sampler_math import SORT_LIMIT, top_indices, top_p_bounded, top_set
from loopchat.engine.sampler_raw import total_bounds
from loopchat.engine.sampler_topp import top_p_unsorted
from loopchat.settings import SamplingSettings
from loopchat.stage_report import StageReport

__all__ = ["Candidates", "Stage", "StageReport", "chain_for", "scaled"]


class Candidates:
    """The tokens still in the running at one step, as the stages narrow them.

    `work`: the logits the stages read (the model's, or a penalized copy); `norm`: the
    sum of exp(work - raw_max) over the vocabulary (the mass unit); `mass`: the share of
    it the candidates hold. Sorted form: `ids` and `logits64` (float64), largest first.
    `z`: once a stage has scaled them, the candidates' float64 logits minus their max,
    divided by the temperature in the sorted form (None: not yet computed); `t`: the
    temperature the unsorted form's z is still to be divided by (the distribution divides
    it in the same pass as its exp, sampler_fused)."""

    __slots__ = (
        "logits",
        "work",
        "context",
        "n_vocab",
        "raw_max",
        "norm",
        "raw_top_ids",
        "report_k",
        "ids",
        "sorted",
        "logits64",
        "z",
        "t",
        "mass",
        "work_max",
        "work_max_id",
        "allowed",
        "bound",
        "source_cache",
    )

    def __init__(
        self,
        logits: np.ndarray,
        context: Sequence[int],
        raw_max: float,
        total: float,
        raw_top_ids: np.ndarray,
        report_k: int,
        bound: tuple[float, float] | None = None,
    ) -> None:
        self.logits = self.work = logits
        self.context = context  # the tokens before this step
        self.n_vocab = logits.shape[0]
        self.raw_max, self.norm = raw_max, total
        self.raw_top_ids, self.report_k = raw_top_ids, report_k
        self.ids: np.ndarray | None = None
        self.sorted = False
        self.logits64: np.ndarray | None = None
        self.z: np.ndarray | None = None
        self.t = 1.0
        self.mass = 1.0
        # the largest of `work` and a token that holds it (None: not known), kept through
        # the penalties' few changes: a pass over the vocabulary saved at each stage
        self.work_max: float | None = raw_max if raw_top_ids.shape[0] else None
        self.work_max_id = int(raw_top_ids[0]) if raw_top_ids.shape[0] else -1
        #: a constraint that left most of the vocabulary: its mask (a bool a token), for top-k and top-p's cut
        self.allowed: np.ndarray | None = None
        #: (X, E): the exact sum of exp(float64(work) - raw_max) is within E of X (sampler_raw's bound)
        self.bound = bound
        self.source_cache: tuple | None = None  # (ids, work[ids], its max), gathered by the constraint's pass

    @property
    def count(self) -> int:
        return self.n_vocab if self.ids is None else int(self.ids.shape[0])

    def source(self) -> np.ndarray:
        """The candidates' logits (float32), in the order of `ids` (source_cache's while `ids` is its own)."""
        if self.source_cache is not None and self.source_cache[0] is self.ids:
            return self.source_cache[1]
        return self.work if self.ids is None else self.work[self.ids]

    def source_max(self, src: np.ndarray) -> float:
        """The largest of `src` (from source()): known, for the whole vocabulary or a cached source, without a pass."""
        if self.source_cache is not None and src is self.source_cache[1]:
            return self.source_cache[2]
        return self.work_max if self.ids is None and self.work_max is not None else float(src.max())

    def change_logits(self, ids: np.ndarray, values: np.ndarray) -> tuple[int, float]:
        """Give the tokens `ids` new logits (on a copy of the model's): sampler_penalized."""
        return sampler_penalized.change_logits(self, ids, values)

    def take_top(self, k: int) -> int:
        """Keep the k largest logits (k <= n_vocab): sorted if k <= SORT_LIMIT, else
        unsorted, never sorted whole (ids None if k is the whole vocabulary). Candidates an
        earlier stage narrowed (the constraint: ids set): the k largest of them. Returns the
        most likely token cut (the k+1-th largest; -1: none)."""
        if self.ids is not None:
            before, was_sorted = self.ids, self.sorted
            self._take_top_of_ids(k)
            if self.ids.shape[0] >= before.shape[0]:
                return -1
            return int(before[k]) if was_sorted else cut_after(self.work, before, self.ids, self.allowed)
        if k > SORT_LIMIT:
            if k >= self.n_vocab:
                self.ids = None
                return -1
            self.ids = top_set(self.work, k)  # (its order is the draw's: see _unsorted_distribution)
            return cut_after(self.work, None, self.ids)
        raw_top = self.raw_top_ids if self.work is self.logits and k <= self.report_k else None
        self.ids, cut = top_and_cut(self.work, k, raw_top)
        self.sorted = True
        self.logits64 = self.work[self.ids].astype(np.float64)
        return cut

    def _take_top_of_ids(self, k: int) -> None:
        assert self.ids is not None
        n = self.ids.shape[0]
        if self.sorted:
            if k < n:
                self.keep_first(k)
            return
        if k >= n:
            if n <= SORT_LIMIT:
                self.sort()
            return
        if self.allowed is not None and k <= SORT_LIMIT:
            # most of the vocabulary allowed: the k largest allowed are among the largest
            # k + (the forbidden ones) logits; a few more than k is nearly always enough
            want = min(self.n_vocab, 2 * k + 16)
            while True:
                top = top_indices(self.work, want)
                top = top[self.allowed[top]]
                if top.shape[0] >= k or want >= self.n_vocab:
                    break
                want = min(self.n_vocab, want * 4)
            self.ids = top[:k]
            self.sorted = True
            self.logits64 = self.work[self.ids].astype(np.float64)
            return
        src = self.work[self.ids]
        if k > SORT_LIMIT:
            self.ids = self.ids[top_set(src, k)]
            return
        self.ids = self.ids[top_indices(src, k)]
        self.sorted = True
        self.logits64 = self.work[self.ids].astype(np.float64)

    def sort(self) -> None:
        """The unsorted candidates in the sorted form (largest first, a stable sort)."""
        assert self.ids is not None
        self.ids = self.ids[np.argsort(-self.work[self.ids], kind="stable")]
        self.sorted = True
        self.logits64 = self.work[self.ids].astype(np.float64)

    def keep_first(self, n: int) -> None:
        """Sorted form: keep the n largest."""
        assert self.ids is not None and self.logits64 is not None
        self.ids, self.logits64 = self.ids[:n], self.logits64[:n]
        if self.z is not None:
            self.z = self.z[:n]

    def mass_of(self, logits64: np.ndarray) -> float:
        """The share of the mass unit these (float64) logits hold."""
        return float(np.exp(logits64 - self.raw_max).sum()) / self.norm

    def report(
        self, stage: str, entered: int, kept_mass: float, cut: int = -1, changed: int = 0, moved: float = 0.0
    ) -> StageReport:
        """A stage's report; the candidates now hold kept_mass (when it removed any); `cut`:
        the most likely token it removed (-1: none); `changed`, `moved`: see change_logits."""
        removed = entered - self.count
        removed_mass = 0.0
        if removed:
            removed_mass = max(self.mass - kept_mass, 0.0)
            self.mass = kept_mass
        cut_prob = 0.0
        if removed and cut >= 0:
            cut_prob = math.exp(float(self.work[cut]) - self.raw_max) / self.norm
        else:
            cut = -1
        return StageReport(stage, removed, removed_mass, self.count, self.mass, cut, cut_prob, changed, moved)


class Stage(Protocol):
    @property
    def name(self) -> str:
        """The stage's name in its StageReport."""
        ...

    def apply(self, c: Candidates) -> StageReport: ...


@dataclass(frozen=True, slots=True)
class RepeatPenalty:
    """Divides the positive logits of the context's last `last_n` tokens by `penalty`,
    multiplies the negative ones (llama.cpp's rule), in float32 as the logits come.
    Removes none."""

    penalty: float
    last_n: int
    name: str = "repeat_penalty"

    def apply(self, c: Candidates) -> StageReport:
        if self.penalty == 1.0 or self.last_n <= 0 or not c.context:
            return c.report(self.name, c.count, c.mass)
        recent = {t for t in c.context[-self.last_n :] if 0 <= t < c.n_vocab}
        changed, moved = 0, 0.0
        if recent:
            ids = np.fromiter(recent, dtype=np.intp, count=len(recent))
            v = c.work[ids]
            changed, moved = c.change_logits(ids, np.where(v > 0, v / self.penalty, v * self.penalty))
        return c.report(self.name, c.count, c.mass, changed=changed, moved=moved)


@dataclass(frozen=True, slots=True)
class Dry:
    """llama.cpp's DRY (dry.py): subtracts from the logit of each token that would extend
    a sequence the context already holds a penalty that grows with its length, in
    float32 as the logits come. Removes none."""

    settings: SamplingSettings
    name: str = "dry"

    def apply(self, c: Candidates) -> StageReport:
        ids, pen = dry.step_penalties(c.context, self.settings, c.n_vocab)
        changed, moved = c.change_logits(ids, c.work[ids] - pen) if ids.size else (0, 0.0)
        return c.report(self.name, c.count, c.mass, changed=changed, moved=moved)


@dataclass(frozen=True, slots=True)
class LogitBias:
    """Adds each listed token's bias to its logit, in float32 as the logits come (OpenAI's
    logit_bias: -100 in effect bans the token, +100 in effect forces it). Removes none."""

    bias: tuple[tuple[int, float], ...]
    name: str = "logit_bias"

    def apply(self, c: Candidates) -> StageReport:
        pairs = [(t, b) for t, b in self.bias if 0 <= t < c.n_vocab]
        changed, moved = 0, 0.0
        if pairs:
            ids = np.array([t for t, _ in pairs], dtype=np.intp)
            changed, moved = c.change_logits(ids, c.work[ids] + np.array([b for _, b in pairs], dtype=np.float32))
        return c.report(self.name, c.count, c.mass, changed=changed, moved=moved)


@dataclass(frozen=True, slots=True)
class TopK:
    """Keeps the k largest logits (0, or more than the vocabulary: all of them)."""

    k: int
    name: str = "top_k"

    def apply(self, c: Candidates) -> StageReport:
        entered = c.count
        k = self.k if 0 < self.k <= c.n_vocab else c.n_vocab
        cut = c.take_top(k)
        if k >= c.n_vocab:
            return c.report(self.name, entered, c.mass)
        if c.sorted:
            assert c.logits64 is not None
            return c.report(self.name, entered, c.mass_of(c.logits64), cut)
        return c.report(self.name, entered, c.mass_of(c.work[c.ids].astype(np.float64)), cut)


@dataclass(frozen=True, slots=True)
class Greedy:
    """Temperature 0: keeps the most likely token alone (the lowest id of equal ones)."""

    name: str = "greedy"

    def apply(self, c: Candidates) -> StageReport:
        entered = c.count
        cut = c.take_top(1)
        assert c.logits64 is not None
        return c.report(self.name, entered, c.mass_of(c.logits64), cut)


@dataclass(frozen=True, slots=True)
class TopP:
    """Keeps the most likely candidates (largest logit first, equal ones by id) up to and
    including the one at which their softmax mass reaches p (1: all of them)."""

    p: float
    name: str = "top_p"

    def apply(self, c: Candidates) -> StageReport:
        entered = c.count
        if self.p >= 1.0 or entered <= 1:
            return c.report(self.name, entered, c.mass)
        if c.sorted:
            assert c.logits64 is not None
            cum = np.cumsum(np.exp(c.logits64 - c.logits64[0]))
            cum /= cum[-1]
            n_keep = int(np.searchsorted(cum, self.p, side="left")) + 1
            n_keep = min(max(n_keep, 1), entered)
            cut = int(c.ids[n_keep]) if n_keep < entered else -1  # type: ignore[index]
            c.keep_first(n_keep)
            share = float(cum[n_keep - 1])
        else:
            # the whole vocabulary: its mass unit estimates the total (float32 exps: to ~1e-6)
            # (the candidates' mass in the unit's terms: an estimate for top_p_set, as the whole vocabulary's)
            known = (c.work_max, (c.norm, c.raw_max)) if c.ids is None else (None, (c.norm * c.mass, c.raw_max))
            before = c.ids
            bounded = top_p_of_vocabulary(c, self.p) if before is None else None
            if bounded is not None:  # (the token cut: among the deep set's, if any is not kept)
                c.ids, cut = bounded[0], cut_among(c.work, bounded[1], bounded[0])
            else:  # (the kept ids and their logits, the later stages' source, in one pass)
                cut, share = top_p_unsorted(c, self.p, known)
            assert c.ids is not None
            if c.ids.shape[0] <= SORT_LIMIT:
                c.sort()
            if before is None:  # (share: of the float64 total; the kept mass is in the mass unit)
                kept64 = c.logits64 if c.logits64 is not None else c.source().astype(np.float64)
                return c.report(self.name, entered, c.mass_of(kept64), cut)
        return c.report(self.name, entered, c.mass * share, cut)


@dataclass(frozen=True, slots=True)
class MinP:
    """Keeps the candidates whose logit is at least max + ln(min_p), in float64 (a
    probability at least min_p times the top one's; 0: all of them)."""

    min_p: float
    name: str = "min_p"

    def apply(self, c: Candidates) -> StageReport:
        entered = c.count
        if self.min_p <= 0.0 or (c.sorted and entered <= 1):
            return c.report(self.name, entered, c.mass)
        if c.sorted:
            assert c.logits64 is not None
            floor = c.logits64[0] + math.log(self.min_p)
            n_keep = max(int(np.count_nonzero(c.logits64 >= floor)), 1)
            if n_keep == entered:
                return c.report(self.name, entered, c.mass)
            w = np.exp(c.logits64 - c.logits64[0])
            cut = int(c.ids[n_keep])  # type: ignore[index]
            c.keep_first(n_keep)
            return c.report(self.name, entered, c.mass * float(w[:n_keep].sum()) / float(w.sum()), cut)
        src = c.source()
        mx = c.source_max(src)
        floor = mx + math.log(self.min_p)
        kept, z, w_sum = sampler_fused.min_p_keep(src, floor, mx)
        before = c.ids
        c.ids = kept if c.ids is None else c.ids[kept]
        c.z = z  # the candidates' logits minus their max, at temperature 1 so far
        cut = cut_below(c.work, before, c.ids, src, floor)
        return c.report(self.name, entered, w_sum * math.exp(mx - c.raw_max) / c.norm, cut)


@dataclass(frozen=True, slots=True)
class Temperature:
    """Divides the candidates' logits (minus their max, in float64) by t. Removes none."""

    t: float
    name: str = "temperature"

    def apply(self, c: Candidates) -> StageReport:
        if self.t != 1.0:  # (dividing by 1 changes nothing)
            if not c.sorted:
                c.t = self.t  # divided in the distribution's pass over the candidates
                return c.report(self.name, c.count, c.mass)
            if c.z is None:
                c.z = scaled(c)
            c.z /= self.t
        return c.report(self.name, c.count, c.mass)


def top_p_of_vocabulary(c: Candidates, p: float) -> tuple[np.ndarray, np.ndarray] | None:
    """top_p_set over the whole vocabulary, without its float64 exp pass where the raw pass's
    bound on the total decides the cut (sampler_math.top_p_bounded: the kept ids, the deep
    set); None: undecided."""
    if c.bound is None:
        return None
    mx = c.source_max(c.work)
    return top_p_bounded(c.work, p, mx, *total_bounds(c.bound, c.raw_max, mx))


def scaled(c: Candidates) -> np.ndarray:
    """The sorted candidates' float64 logits minus their max (a new array; the unsorted
    form's are computed in the distribution's own pass, sampler_fused)."""
    assert c.sorted and c.logits64 is not None
    return c.logits64 - c.logits64[0]


@functools.lru_cache(maxsize=64)
def chain_for(settings: SamplingSettings) -> tuple[Stage, ...]:
    """The stages of a step under these settings, in order (the same objects for equal
    settings: they are immutable)."""
    penalties: tuple[Stage, ...] = (RepeatPenalty(settings.repeat_penalty, settings.repeat_last_n), Dry(settings))
    if settings.logit_bias:
        penalties += (LogitBias(settings.logit_bias),)
    if settings.greedy:
        return (*penalties, Greedy())
    return (
        *penalties,
        TopK(settings.top_k),
        TopP(settings.top_p),
        MinP(settings.min_p),
        Temperature(settings.temperature),
    )


@functools.lru_cache(maxsize=64)  # (one reply's stage, a few chains: the same tuple each pass)
def with_constraint(chain: tuple[Stage, ...], stage: Any) -> tuple[Stage, ...]:
    """The chain with a reply's constraint stage (sampler_constraint) in its place: after the
    penalties and the logit bias, before the first stage that narrows (top-k, or greedy)."""
    at = next((i for i, s in enumerate(chain) if s.name in ("top_k", "greedy")), len(chain))
    return (*chain[:at], stage, *chain[at:])
