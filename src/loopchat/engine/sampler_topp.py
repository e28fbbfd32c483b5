"""Top-p over the unsorted candidates (more than SORT_LIMIT: a JSON schema's ~250,000 on Gemma's
vocabulary, or the whole vocabulary where the raw pass's bound left the cut open), the stage's
kept set taken in one pass.

sampler_math.top_p_positions finds the kept candidates as positions into their logits (the
chain's source, `Candidates.source()`); sampler_fused.take then writes their ids and their
logits in one loop, with the least kept logit and its ties, which the stage's cut token
(sampler_cuts.cut_after) reads instead of gathering the kept logits again, and the later stages
(min-p, the distribution) read the kept logits as their source instead of gathering them a third
time (docs/performance.md, "Eighth session"). The same ids in the same order, the same numbers.
Where the kernel's bins ran, its call also found the kept logits' reported top among top-p's deep set,
which the distribution reads instead of searching the kept logits again (Candidates.top_of;
"Fourteenth session").
"""

from __future__ import annotations

import math
from typing import Any

from loopchat.engine import sampler_fused
from loopchat.engine.sampler_cuts import cut_after
from loopchat.engine.sampler_math import top_p_bounded, top_p_positions
from loopchat.engine.sampler_raw import total_bounds


def top_p_of_vocabulary(c: Any, p: float) -> tuple[Any, Any] | None:
    """top_p_positions over the whole vocabulary, without its float64 exp pass where the raw pass's
    bound on the total decides the cut (sampler_math.top_p_bounded: the kept ids, the deep
    set); None: undecided. `c`: sampler_stages' Candidates."""
    if c.bound is None:
        return None
    mx = c.source_max(c.work)
    return top_p_bounded(c.work, p, mx, *total_bounds(c.bound, c.raw_max, mx))


def top_p_unsorted(c: Any, p: float, known: tuple) -> tuple[int, float]:
    """The unsorted candidates `c` (sampler_stages.Candidates) narrowed to their top-p set: `c.ids`
    and `c.source_cache` set to the kept ones, whose largest logit is the candidates' (top-p keeps
    the most likely token). `known`: (the candidates' largest logit if known, (the estimate of their
    mass, its shift)), as top_p_positions takes them. Returns (the most likely token cut, -1: none; the
    share of the candidates' mass kept)."""
    before, src = c.ids, c.source()
    mx = c.source_max(src) if before is not None else known[0]
    inside: list = []
    exps = c.exps_of(src, mx) if mx is not None else None  # (the constraint's pass's, where at this shift)
    scaled = c.scaled_exps_of(src, mx) if mx is not None and exps is None else None  # (or above it: chain24)
    top_out: list = [c.report_k + 1]  # (the kept logits' top, where the search's own call found it: chain12)
    kept, share = top_p_positions(
        c.work, before, p, mx, known[1], src=src, inside=inside, exps=scaled if exps is None else exps,
        top_out=top_out, scaled=scaled is not None, sample=c.sample_of(src),
    )  # fmt: skip
    top = top_out[1] if len(top_out) == 2 else None
    ids, kept_src, low, n_low = sampler_fused.take(kept, before, src)
    c.ids = ids
    c.source_cache = (ids, kept_src, c.source_max(src) if mx is None else mx)
    c.source_top = None if top is None else (kept_src, top)
    # (the constraint's ascending ids: all it allows; its mask is made only where cut_after reads it)
    in_order = before is None or (c.has_allowed and c.allowed_n == before.shape[0])
    if inside and in_order:
        cut = _cut_inside(inside[0], src, before, (low, n_low))
        if cut is not None:
            return cut, share
    mask = None if before is None else c.allowed
    return cut_after(c.work, before, ids, mask, (low, n_low), c.allowed_n if mask is not None else -1), share


def _cut_inside(inside: tuple, src: Any, before: Any, least: tuple[float, int]) -> int | None:
    """The most likely candidate top-p cut, from what its search knew (`inside`: top_p_positions's), where
    the candidates `before` are in id order (None: the whole vocabulary; else the constraint's ascending
    ids), so that the first position of equal logits is their lowest id: ("at", its position), the kernel's
    bins'; ("deep", ...): every candidate outside the deep set has a smaller logit than every one in it, so
    where the deep set holds one not kept, the most likely of those is the candidates' (cut_after over the
    deep set's logits, in position order; the ties of the least kept are all in it). None: every deep-set
    candidate was kept, or a logit is not finite (cut_after over the candidates decides)."""
    if sampler_fused.kernel is None:
        return None
    if inside[0] == "at":
        pos = inside[1]
        if not math.isfinite(float(src[pos])):
            return None
    else:
        _, deep, x_deep, local = inside
        if local.shape[0] >= deep.shape[0] or not math.isfinite(float(x_deep.min())):
            return None
        i = cut_after(x_deep, None, local, None, least)
        if i < 0:
            return -1
        pos = int(deep[i])
    return pos if before is None else int(before[pos])
