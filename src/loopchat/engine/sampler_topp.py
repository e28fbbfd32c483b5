"""Top-p over the unsorted candidates (more than SORT_LIMIT: a JSON schema's ~250,000 on Gemma's
vocabulary, or the whole vocabulary where the raw pass's bound left the cut open), the stage's
kept set taken in one pass.

sampler_math.top_p_positions finds the kept candidates as positions into their logits (the
chain's source, `Candidates.source()`); sampler_fused.take then writes their ids and their
logits in one loop, with the least kept logit and its ties, which the stage's cut token
(sampler_cuts.cut_after) reads instead of gathering the kept logits again, and the later stages
(min-p, the distribution) read the kept logits as their source instead of gathering them a third
time (docs/performance.md, "Eighth session"). The same ids in the same order, the same numbers.
"""

from __future__ import annotations

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
    kept, share = top_p_positions(c.work, before, p, mx, known[1], src=src)
    ids, kept_src, low, n_low = sampler_fused.take(kept, before, src)
    c.ids = ids
    c.source_cache = (ids, kept_src, c.source_max(src) if mx is None else mx)
    mask = None if before is None else c.allowed
    return cut_after(c.work, before, ids, mask, (low, n_low), c.allowed_n if mask is not None else -1), share
