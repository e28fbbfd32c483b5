"""The distribution the sampling chain draws from (sampler.py): the candidates the stages left,
their weights and the figures a step reports of them.

The sorted form (at most SORT_LIMIT candidates, in order: their probabilities normalised) and the
unsorted form (more: their weights exp((logit - max) / t) in the order they come, not divided by
their sum, with the sums of their blocks of DRAW_BLOCK for the draw, one pass of sampler_fused;
where every token is kept, or where the candidates' largest logits order their weights, the
weights are not stored at all, only recomputed where a report or the draw needs them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from loopchat.engine import sampler_fused
from loopchat.engine.sampler_math import DRAW_BLOCK, top_indices
from loopchat.engine.sampler_stages import Candidates, scaled

#: log2(e): nats to bits (sampler.py's raw entropy too)
LOG2E = 1.0 / math.log(2.0)


@dataclass(slots=True)
class Distribution:
    """What the chain left, to draw from: `probs` over `ids` (None: the whole vocabulary,
    a token's index its id), still to be divided by `norm`; `top`: the positions of the
    reported candidates, most likely first; `blocks`: the unsorted form's block sums.
    `probs` None: the weights were not stored (every token kept, sampler_fused's
    distribution_sums); they are exp((source - shift) / t), recomputed where needed."""

    ids: np.ndarray | None
    probs: np.ndarray | None
    norm: float
    entropy: float
    top: np.ndarray
    blocks: np.ndarray | None
    n: int
    source: np.ndarray | None = None
    shift: float = 0.0
    t: float = 1.0

    def weights(self, pos: np.ndarray | slice) -> np.ndarray:
        """The (unnormalised) weights at these positions."""
        if self.probs is not None:
            return self.probs[pos]
        assert self.source is not None
        return sampler_fused.weights_of(self.source[pos], self.shift, self.t)

    def position(self, token: int) -> int | None:
        """Where `token` is among the candidates (None: the settings cut it)."""
        if self.ids is None:
            return token
        where = np.flatnonzero(self.ids == token)
        return int(where[0]) if where.size else None

    def block(self, first: int, stop: int) -> np.ndarray:
        """The weights of positions first..stop (a draw's block)."""
        return self.weights(slice(first, stop))


def sorted_distribution(c: Candidates) -> Distribution:
    """The sorted form: the probabilities normalised, the candidates already in order."""
    z = c.z if c.z is not None else scaled(c)
    probs = np.exp(z)
    probs /= probs.sum()
    nz = probs[probs > 0]
    entropy = float(-(nz * np.log2(nz)).sum()) if nz.shape[0] > 1 else 0.0
    assert c.ids is not None
    return Distribution(c.ids, probs, 1.0, entropy, np.arange(min(c.report_k, c.ids.shape[0])), None, probs.shape[0])


def unsorted_distribution(c: Candidates) -> Distribution:
    """More than SORT_LIMIT candidates, in the order they come (the same for the same
    logits and settings, so a seed still draws the same tokens): their weights exp(z),
    z = (logit - max) / t, not divided by their sum (the caller divides only the few it
    reports, a pass over the vocabulary saved), the sums of their blocks of DRAW_BLOCK
    (one pass serves the sum and the draw: see draw_unsorted), their entropy in bits:
    ln(norm) - sum(w z) / norm in nats, no logarithm per candidate. One pass of
    sampler_fused."""
    if c.z is not None:  # min-p's: the logits minus their max already
        weights, blocks, norm, wz = sampler_fused.distribution(c.z, 0.0, c.t, DRAW_BLOCK)
        n = weights.shape[0]
    elif c.ids is None:
        # every token kept: the weights are not stored (2 bytes a float32 logit more
        # written and read again), only recomputed where a report or the draw needs them
        src, shift, weights = c.work, c.source_max(c.work), None
        blocks, norm, wz = sampler_fused.distribution_sums(src, shift, c.t, DRAW_BLOCK)
        n = c.n_vocab
    else:
        src = c.source()
        shift = c.source_max(src)
        top_of_src = top_by_logits(src, shift, c.t, c.report_k, c.top_of(src, c.report_k + 1))
        if top_of_src is not None:  # (the weights not stored either: their top is the logits')
            blocks, norm, wz = sampler_fused.distribution_sums(src, shift, c.t, DRAW_BLOCK)
            entropy = weights_entropy_bits(norm, wz, src.shape[0])
            return Distribution(c.ids, None, norm, entropy, top_of_src, blocks, src.shape[0], src, shift, c.t)
        weights, blocks, norm, wz = sampler_fused.distribution(src, shift, c.t, DRAW_BLOCK)
        n = weights.shape[0]
    entropy = weights_entropy_bits(norm, wz, n)
    # only the reported candidates are sorted. Every token kept: the probabilities rise
    # with the logits, so the top logits (float32, half the bytes) are the top
    # probabilities, and without a penalty they are the raw top already
    if weights is not None and c.ids is not None:
        top = top_indices(weights, c.report_k)
    elif c.work is c.logits:
        top = c.raw_top_ids
    else:
        top = top_indices(c.work, c.report_k)
    if weights is None:
        return Distribution(None, None, norm, entropy, top, blocks, n, c.work, shift, c.t)
    return Distribution(c.ids, weights, norm, entropy, top, blocks, n)


def weights_entropy_bits(norm: float, wz: float, n: int) -> float:
    """The entropy in bits of n weights w summing to `norm` with sum(w z) = `wz`: ln(norm) -
    wz / norm nats (0 for one candidate; never below 0, which rounding could give)."""
    return max((math.log(norm) - wz / norm) * LOG2E, 0.0) if n > 1 else 0.0


def top_by_logits(
    src: np.ndarray, shift: float, t: float, k: int, known: np.ndarray | None = None
) -> np.ndarray | None:
    """The positions of the k largest weights exp((src - shift) / t) of float32 candidates `src`,
    largest first, equal ones by position (top_indices of the stored weights), found among the
    float32 logits (half the bytes, the kernel's search) where that is the same answer: the top
    k + 1 logits, no tie between the k-th and the next, and their k + 1 weights (as the
    distribution computes them) strictly falling wherever the logits do. None: not so (a tie
    across the cut, two logits one weight), or too few candidates: the weights are stored and
    searched. `known`: top_indices(src, k + 1), where top-p's search found it (Candidates.top_of)."""
    n = src.shape[0]
    if src.dtype != np.float32 or not 0 < k < n - 1:
        return None
    top = top_indices(src, k + 1) if known is None else known  # (known: top-p's search found them)
    v = src[top]
    vl = v.tolist()
    if not vl[k - 1] > vl[k]:
        return None
    # (numpy's compares of the k + 1 neighbours, in Python floats: the same order, no temporaries)
    wl = sampler_fused.weights_of(v, shift, t).tolist()
    if any((vl[i + 1] < vl[i]) != (wl[i + 1] < wl[i]) for i in range(k)):
        return None
    return top[:k]
