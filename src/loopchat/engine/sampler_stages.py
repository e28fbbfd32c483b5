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
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from loopchat.engine import dry, sampler_fused, sampler_penalized
from loopchat.engine.sampler_candidates import Candidates
from loopchat.engine.sampler_cuts import cut_among, cut_below
from loopchat.engine.sampler_math import SORT_LIMIT
from loopchat.engine.sampler_topp import top_p_of_vocabulary, top_p_unsorted
from loopchat.settings import SamplingSettings
from loopchat.stage_report import StageReport

__all__ = ["Candidates", "Stage", "StageReport", "chain_for", "scaled"]


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
        ids = sampler_penalized.recent_ids(c.context, self.last_n, c.n_vocab)  # (in the order each first comes)
        changed, moved = 0, 0.0
        if ids.shape[0]:  # (the new values v / penalty where v > 0, else v * penalty, made with the change)
            changed, moved = c.change_logits(ids, None, self.penalty)
        return c.report(self.name, c.count, c.mass, changed=changed, moved=moved)


@dataclass(frozen=True, slots=True)
class CountPenalty:
    """OpenAI's frequency and presence penalties, as llama.cpp's penalties sampler applies them
    after its repeat penalty: each token the context's last `last_n` tokens hold n > 0 times
    loses n * frequency + presence from its logit, in float32 as the logits come. Removes none."""

    frequency: float
    presence: float
    last_n: int
    name: str = "frequency_presence"

    def apply(self, c: Candidates) -> StageReport:
        if self.last_n <= 0 or not c.context:
            return c.report(self.name, c.count, c.mass)
        window = np.asarray(c.context[-self.last_n :], dtype=np.int64)
        ids, counts = np.unique(window[(window >= 0) & (window < c.n_vocab)], return_counts=True)
        changed, moved = 0, 0.0
        if ids.size:  # (float(count) * freq + float(count > 0) * present, in float32: llama.cpp's)
            n = counts.astype(np.float32)
            cut = n * np.float32(self.frequency) + np.float32(self.presence)
            changed, moved = c.change_logits(ids, c.work[ids] - cut)
        return c.report(self.name, c.count, c.mass, changed=changed, moved=moved)


@dataclass(frozen=True, slots=True)
class Dry:
    """llama.cpp's DRY (dry.py): subtracts from the logit of each token that would extend
    a sequence the context already holds a penalty that grows with its length, in
    float32 as the logits come. Removes none."""

    settings: SamplingSettings
    name: str = "dry"
    #: whether DRY does anything under these settings (dry.enabled, once)
    on: bool = field(init=False, default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        s = self.settings
        object.__setattr__(self, "on", dry.enabled(s.dry_multiplier, s.dry_base, s.dry_penalty_last_n))

    def apply(self, c: Candidates) -> StageReport:
        if not self.on:
            return c.report(self.name, c.count, c.mass)
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
            return c.report(self.name, entered, c.sorted_mass(), cut)
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
            # (the candidates' mass in the unit's terms: an estimate for top_p_positions, as the whole vocabulary's)
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
        before = c.ids
        # (the constraint's ascending ids: the first of equal logits is their lowest id; other ids: the
        # kernel looks for a second position of the cut logit)
        ascending = before is None or before is c.ascending_ids
        kept, z, w_sum, at = sampler_fused.min_p_keep(src, floor, mx, not ascending)
        c.ids = kept if before is None else before[kept]
        c.z = z  # the candidates' logits minus their max, at temperature 1 so far
        cut = cut_below(c.work, before, c.ids, src, floor, ascending, at)
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


def scaled(c: Candidates) -> np.ndarray:
    """The sorted candidates' float64 logits minus their max (a new array; the unsorted
    form's are computed in the distribution's own pass, sampler_fused)."""
    assert c.sorted and c.logits64 is not None
    return c.logits64 - c.logits64[0]


@functools.lru_cache(maxsize=64)
def chain_for(settings: SamplingSettings) -> tuple[Stage, ...]:
    """The stages of a step under these settings, in order (the same objects for equal
    settings: they are immutable)."""
    penalties: tuple[Stage, ...] = (RepeatPenalty(settings.repeat_penalty, settings.repeat_last_n),)
    if settings.frequency_penalty or settings.presence_penalty:  # (a stage only when set, as the bias's)
        penalties += (CountPenalty(settings.frequency_penalty, settings.presence_penalty, settings.repeat_last_n),)
    penalties += (Dry(settings),)
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
