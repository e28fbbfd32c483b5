"""The drawn token's two ranks in one pass, under a constraint (chain15, issue 24).

Where the token drawn is neither in the raw top nor in the distribution's reported top (a draw at T 2 over
~250,000 allowed tokens on Gemma, most steps), sampler.sample counted twice: the raw rank over the model's
logits (rank_of: 1 + how many exceed the token's logit) and the sampled rank over the candidates' float32
logits (_sampled_rank: 1 + how many of them exceed the token's, the weights' order where its logit is not
tiny), two passes over ~1 MB each, cold. Under a constraint that allows most of the vocabulary the
candidates are the allowed tokens the stages after it left, always a prefix of them by (penalized) logit
(top-p keeps the largest, min-p those above a floor, top-k's few are the sorted form, not this one): so
those exceeding the drawn one's logit are all the allowed ones that do. The kernel's count_pair counts
both over the model's logits and the constraint's mask in one read; the tokens the penalties changed
(a few dozen) are then counted by their new logits instead. The same two integers (docs/performance.md,
"Fifteenth session (chain15)").
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from loopchat.engine import sampler_fused

__all__ = ["both_ranks", "logits_order"]

#: below this (in bits of a weight's exponent: exp(-700)) or for a logit this close to 0, the weights'
#: order may not be the float32 logits' (sampler._sampled_rank then computes the weights)
_RANK_Z_FLOOR = -700.0
_RANK_TINY_LOGIT = 1e-3


def logits_order(x: float, shift: float, t: float) -> bool:
    """Whether the weights exp((v - shift) / t) rank like the float32 logits v around the logit x."""
    return abs(x) >= _RANK_TINY_LOGIT and (x - shift) / t > _RANK_Z_FLOOR


class Candidates(Protocol):
    """What both_ranks reads of the step's candidates (sampler_candidates.Candidates)."""

    logits: np.ndarray
    work: np.ndarray
    changed_ids: list[np.ndarray]
    allowed_words: np.ndarray | None


class Drawn(Protocol):
    """What both_ranks reads of the distribution drawn from (sampler_distribution.Distribution)."""

    ids: np.ndarray | None
    probs: np.ndarray | None
    top: np.ndarray
    source: np.ndarray | None
    shift: float
    t: float


def both_ranks(c: Candidates, d: Drawn, token: int, pick: int, raw_top: np.ndarray) -> tuple[int, int] | None:
    """(the raw rank, the sampled rank) of `token`, drawn at position `pick` of d's candidates, where
    both are counted: the token outside the raw top `raw_top` and `pick` outside d's reported top, d's
    weights exp((d.source - d.shift) / d.t) not stored. None: not this case (no constraint's mask, no
    kernel, a logit whose weight's order may not be its own, a count not needed): as before."""
    # (the two tops as lists: a few ints, a membership test without numpy's compare and reduction)
    if d.ids is None or d.probs is not None or token in raw_top.tolist() or pick in d.top.tolist():
        return None
    source = d.source
    words, kernel = c.allowed_words, sampler_fused.kernel
    if words is None or kernel is None or source is None or not c.logits.flags.c_contiguous:
        return None
    x = float(source[pick])
    if not logits_order(x, d.shift, d.t):
        return None
    # (the changed tokens the mask allows: counted in the same call by their new logits, not the model's;
    # the kernel takes int64 ids, as top_among's)
    changed = [a if a.dtype == np.int64 else a.astype(np.int64) for a in c.changed_ids]
    n_raw, n_allowed = kernel.count_pair(c.logits, words, token, x, c.work, changed)
    return n_raw + 1, n_allowed + 1
