"""The reported top among a constraint's allowed tokens, from the raw top (chain15, issue 24).

Where every token a constraint allows goes on to the distribution (no top-k, top-p 1, min-p 0),
the distribution reports the allowed logits' report_k largest: sampler_distribution.top_by_logits searched
them by a pass over the ~250,000 allowed logits on Gemma (the kernel's top_k, ~0.08 ms a step,
the logits cold). They are found instead among a few dozen tokens: the raw pass's top (`wide`,
the model's M largest logits, found by the same top_k pass as the raw top, M a little above
report_k + 1) and the tokens the penalties changed (`changed`: their new logits may be anything).
Every other token's logit is its raw one, below the M-th raw logit (top_k's answer holds the M + 1
largest distinct), so where the allowed candidates' k + 1 largest are strictly falling, each at or
above that M-th logit and the last above every other candidate, they are the allowed logits' k + 1
largest: top_indices(src, k + 1) itself (the one set, in the one order). Else None: the pass as
before. (docs/performance.md, "Fifteenth session (chain15)".)
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from loopchat.engine import sampler_fused

__all__ = ["raw_top", "top_among"]


class Candidates(Protocol):
    """What top_among reads of the step's candidates (sampler_candidates.Candidates)."""

    logits: np.ndarray
    work: np.ndarray
    changed_ids: list[np.ndarray]


def wide_k(report_k: int) -> int:
    """How many of the model's largest logits the raw top's pass finds for top_among (0: none): room
    for the forbidden and the penalized among them."""
    m = min(2 * report_k + 16, sampler_fused.TOP_K_MAX)
    return m if 0 < report_k and report_k + 2 <= m else 0


def raw_top(logits: np.ndarray, report_k: int, keeps_all: bool) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(the raw top: sampler_fused.top_k(logits, report_k), None where it does not answer; the wide top
    top_among reads, or None). `keeps_all`: every allowed token goes on to the distribution, so the wide
    top is wanted: the same pass finds both (its first report_k are the raw top, the M + 1 distinct)."""
    n = logits.shape[0]
    m = wide_k(report_k) if keeps_all else 0
    if 0 < m < n - 1 and (wide := sampler_fused.top_k(logits, m)) is not None:
        return wide[:report_k], wide
    return (sampler_fused.top_k(logits, report_k) if 0 < report_k < n else None), None


def top_among(
    c: Candidates, wide: np.ndarray, ids: np.ndarray, src: np.ndarray, k1: int, words: np.ndarray | None = None
) -> np.ndarray | None:
    """top_indices(src, k1), where `src` holds the candidates' (penalized) logits of the allowed `ids`
    (ascending), `wide` the model's M largest logits' ids, largest first, their M + 1 largest distinct
    (the kernel's top_k: no NaN among the logits), c.changed_ids the ids whose logits the penalties
    changed, `words` the constraint's mask (32 bits a word; None: numpy's steps). None: not shown to be
    that answer here (the caller searches)."""
    changed = c.changed_ids
    cand = np.concatenate((wide, *changed)) if changed else wide
    tau = float(c.logits[wide[-1]])
    kernel = sampler_fused.kernel
    if kernel is not None and words is not None and c.work.flags.c_contiguous:
        # (one call: the ~100 candidates' bits, logits and order, and the chosen ones' positions by a
        # prefix count of the words: numpy's searchsorted, unique and argsort read ~2 MB of ids cold)
        out = np.empty(k1, dtype=np.intp)
        return out if kernel.top_among(c.work, words, cand.astype(np.int64, copy=False), tau, out) else None
    pos = np.searchsorted(ids, cand)
    np.minimum(pos, ids.shape[0] - 1, out=pos)
    pos = np.unique(pos[ids[pos] == cand])  # (the allowed ones, by position: a token once)
    if pos.shape[0] < k1:
        return None
    v = src[pos]
    if np.isnan(v).any():  # (a penalized NaN: numpy's top_indices places it its own way)
        return None
    order = np.argsort(-v, kind="stable")
    top = order[:k1]
    tv = v[top]
    last = tv[-1]
    # strictly falling, the last at or above the M-th raw logit (every token outside cand is below it)
    # and above the next candidate
    if not last >= tau or not np.all(tv[1:] < tv[:-1]):
        return None
    if pos.shape[0] > k1 and not last > v[order[k1]]:
        return None
    return pos[top]
