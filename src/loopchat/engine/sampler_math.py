"""The numeric pieces the sampler's stages are built from, each written to cost a small
fraction of a forward pass on a large vocabulary: an exact top-K that does not sort the
vocabulary, the top-p cut-off found without sorting the candidates, a draw without a
cumulative sum of the vocabulary. Their passes over the whole vocabulary are
sampler_fused's (the C kernel or numpy), their arrays scratch memory (sampler_scratch).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from loopchat.engine import sampler_fused
from loopchat.engine.sampler_scratch import scratch


def top_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values of a 1-D array, largest first (exact).

    For a large array, a strided sample gives a threshold that at least k values
    reach (the sampled values are themselves in the array), so only the few values
    above it are partitioned and sorted.
    """
    n = x.shape[0]
    if k >= n:
        return np.argsort(-x, kind="stable")
    if k <= 0:
        return np.empty(0, dtype=np.intp)
    cand: np.ndarray | None = None
    if n > 4096:
        sample = x[::32]
        if sample.shape[0] > k:
            threshold = np.partition(sample, sample.shape[0] - k)[sample.shape[0] - k]
            cand = sampler_fused.at_least(x, threshold)
    return _top_of(x, np.arange(n) if cand is None else cand, k)


def _top_of(x: np.ndarray, cand: np.ndarray, k: int) -> np.ndarray:
    """The k largest of x among the positions cand (which hold them all), largest first."""
    sub = x[cand]
    if sub.shape[0] > k:
        part = np.argpartition(sub, sub.shape[0] - k)[sub.shape[0] - k :]
        cand = cand[part]
        sub = sub[part]
    order = np.argsort(-sub, kind="stable")
    return cand[order]


#: Above this many candidates the chain does not sort them: with top-k off a full sort of
#: the vocabulary costs a large share of a pass (docs/performance.md, "Figures behind the
#: code's choices", "The sampler's numpy").
SORT_LIMIT = 1024


def top_set(work: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, in no particular order (all of them if k >= n)."""
    n = work.shape[0]
    return np.arange(n) if k >= n else np.argpartition(work, n - k)[n - k :]


#: top-p first tries this many of the largest logits (see top_p_set) ...
_TOP_P_HEAD = 64
#: ... then about this many, above a threshold taken from a strided sample
_TOP_P_DEEP = 8192
_TOP_P_STRIDE = 32


def top_p_set(
    work: np.ndarray,
    cand: np.ndarray | None,
    top_p: float,
    known_max: float | None = None,
    approx: tuple[float, float] | None = None,
) -> tuple[np.ndarray, float]:
    """The top-p candidates of `cand` (unsorted; None: the whole vocabulary): what a sort
    by logit, largest first (equal logits in id order), keeps up to and including the
    token at which the softmax mass reaches top_p, found without sorting them all.

    Only the total mass needs every token (in float64, as the reference). The cut-off
    is looked for among the largest logits first: the exact top _TOP_P_HEAD (a sharp
    distribution ends there), then every token at or above a threshold that about
    _TOP_P_DEEP reach (a flat one: a base model, or a high temperature that drifted the
    text), used only if those tokens do hold top_p of the mass (summed exactly): all
    tokens below it are then below the cut-off. Else, or within that set, the bins of
    top_p_bins find it. The float64 arrays are scratch memory (see sampler_scratch).

    `approx`: (an estimate of the candidates' total mass exp(logit - shift) to 1e-5, the
    shift): where it says the head or the deep set holds top_p, the masses of the
    vocabulary are summed and not stored (2 MB not written on Gemma 3), the head's and the
    deep set's recomputed (a few thousand exps); else, or if the estimate was wrong, they
    are stored. Either way the same numbers: the estimate only chooses what is kept.

    Returns the kept candidates and the share of the candidates' softmax mass they hold
    (both sums in float64, found on the way). `known_max`: the candidates' largest logit,
    if the caller knows it."""
    src = work if cand is None else work[cand]  # float32
    m = src.shape[0]
    mx = float(src.max()) if known_max is None else known_max
    head, store = None, approx is None or m <= _TOP_P_HEAD
    if approx is not None:
        target_estimate = top_p * approx[0] * math.exp(approx[1] - mx)
        # (the most likely token alone surely holds top_p: neither head nor masses needed)
        if target_estimate * _MARGIN > 1.0 and m > _TOP_P_HEAD:
            head = _Head(src, mx)
            store = not head.holds(target_estimate * _MARGIN)
    # q = exp(float64(logit) - max), one pass (sampler_fused), stored only if needed
    q = scratch.get("f64b", m, np.float64) if store else None
    total = sampler_fused.exp_sum(src, mx, q)
    target = top_p * total
    if target <= 1.0:
        # the most likely token alone holds top_p (its q is exp(0) = 1): the first of
        # equal ones, as the sort puts them (a sharp distribution: no search at all)
        top = int(np.argmax(src))
        return np.array([top if cand is None else cand[top]], dtype=np.intp), 1.0 / total
    if head is None and m > _TOP_P_HEAD:
        head = _Head(src, mx)
    if head is not None:
        ids = head.pos if cand is None else cand[head.pos]
        order = np.lexsort((ids, -src[head.pos]))  # largest first, equal ones by id
        cum = np.cumsum(head.q(q)[order])
        n_keep = int(np.searchsorted(cum, target, side="left")) + 1
        if n_keep < _TOP_P_HEAD:  # reached inside the head (its last entry may tie with the next)
            return ids[order[:n_keep]], float(cum[n_keep - 1]) / total
        if head.above is not None:
            deep, q_sub = head.deep(q)  # in id order
            if float(q_sub.sum()) >= target:
                kept, mass = top_p_bins(src[deep], q_sub, target)
                kept = deep[kept]
                return (kept if cand is None else cand[kept]), mass / total
    if q is None:  # (the estimate was wrong: the masses after all)
        q = scratch.get("f64b", m, np.float64)
        sampler_fused.exp_sum(src, mx, q)
    kept, mass = top_p_bins(src, q, target)
    return (kept if cand is None else cand[kept]), mass / total


#: an estimate's margin: it must say the head or the deep set holds more than this times
#: the target (the estimate from float32 exps is within 1e-5 of the total: see TopP)
_MARGIN = 1.0 + 1e-4


class _Head:
    """top-p's head (the exact top _TOP_P_HEAD of src, in no order) and, on a large
    vocabulary, the deep set's threshold (`above[0]`), with their masses exp(x - mx)
    taken from the stored q or recomputed (sampler_fused.weights_of)."""

    def __init__(self, src: np.ndarray, mx: float) -> None:
        self.src, self.mx = src, mx
        sample = src[::_TOP_P_STRIDE]
        s, j = sample.shape[0], _TOP_P_DEEP // _TOP_P_STRIDE
        self.above: np.ndarray | None = None
        if s > 4 * j:
            # one partition of the sample gives the deep set's threshold and the head's (as
            # top_indices takes it: the same candidates, in a pass of sampler_fused)
            self.above = np.partition(sample, s - 1 - j)[s - 1 - j :]  # the sample's j + 1 largest
            head_threshold = np.partition(self.above, j + 1 - _TOP_P_HEAD)[j + 1 - _TOP_P_HEAD]
            self.pos = _top_of(src, sampler_fused.at_least(src, head_threshold), _TOP_P_HEAD)
        else:
            self.pos = top_indices(src, _TOP_P_HEAD)
        self._q: np.ndarray | None = None
        self._deep: tuple[np.ndarray, np.ndarray] | None = None

    def q(self, q: np.ndarray | None) -> np.ndarray:
        if q is not None:
            return q[self.pos]
        if self._q is None:
            self._q = sampler_fused.weights_of(self.src[self.pos], self.mx, 1.0)
        return self._q

    def deep(self, q: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The deep set's positions (in order) and their masses."""
        assert self.above is not None
        if self._deep is None:
            deep = sampler_fused.at_least(self.src, self.above[0])
            q_sub = q[deep] if q is not None else sampler_fused.weights_of(self.src[deep], self.mx, 1.0)
            self._deep = deep, q_sub
        return self._deep

    def holds(self, target: float) -> bool:
        """Whether the head's or the deep set's mass (recomputed) is at least target."""
        if float(self.q(None).sum()) >= target:
            return True
        return self.above is not None and float(self.deep(None)[1].sum()) >= target


def top_p_bins(x: np.ndarray, q: np.ndarray, target: float, bins: int = 2048) -> tuple[np.ndarray, float]:
    """Positions in x (float32 logits; q their masses exp(x - max), float64) of what a
    stable sort by logit, largest first, keeps until the mass reaches target (unsorted).
    The logits go into bins of equal width (a bin index is monotone in the logit, so a
    higher bin holds only larger logits); the bins' masses, summed from the top, point
    to the bin where the target is reached; every token above it is kept, and only the
    tokens of that bin are sorted. Also returns the kept tokens' mass (the sum of their q)."""
    c = x.shape[0]
    mx, lo = float(x.max()), float(x.min())
    hist = None
    if mx > lo and bins / (mx - lo) < 1e30:
        # the bin index (x - lo) * (bins / (mx - lo)), in float32 as the logits come: each
        # step rounds monotonically, so a higher bin still holds only larger logits
        idx, hist = sampler_fused.bin_masses(x, np.float32(lo), np.float32(bins / (mx - lo)), bins, q)
    elif mx > lo:  # (a spread too narrow for float32's range: the same in float64)
        vals64 = scratch.get("f64a", c, np.float64)
        vals64[...] = x
        vals64 -= lo
        vals64 *= bins / (mx - lo)
        idx = scratch.get("intp", c, np.intp)
        np.copyto(idx, vals64, casting="unsafe")
        np.minimum(idx, bins - 1, out=idx)
    else:
        idx = np.zeros(c, dtype=np.intp)
    if hist is None:
        hist = np.bincount(idx, weights=q, minlength=bins)
    from_top = np.cumsum(hist[::-1])
    b = bins - 1 - min(int(np.searchsorted(from_top, target, side="left")), bins - 1)
    mass_above = float(from_top[bins - 2 - b]) if b < bins - 1 else 0.0
    above, inside = sampler_fused.bin_split(idx, b)
    order = inside[np.argsort(-x[inside], kind="stable")]
    cum = mass_above + np.cumsum(q[order])
    n_keep = min(int(np.searchsorted(cum, target, side="left")) + 1, order.shape[0])
    kept = np.concatenate([above, order[:n_keep]])
    return kept, float(cum[n_keep - 1])


#: the unsorted path's draw sums its probabilities in blocks of this many
DRAW_BLOCK = 1024


def draw_unsorted(
    probs: np.ndarray | None,
    u: float,
    block_sums: np.ndarray | None = None,
    block_of: Callable[[int, int], np.ndarray] | None = None,
) -> int:
    """The index searchsorted(cumsum(probs), u, side="right") finds (the last one if
    rounding leaves u past the end), without a cumulative sum of the whole array (its
    cost on a large vocabulary: docs/performance.md, "Figures behind the code's choices",
    "The sampler's numpy"). Block sums point to the block
    where the running total passes u, and only that block is summed one by one. (The
    sums are rounded in another order: a u within a few ulps of a boundary may pick the
    neighbour; the same logits and seed still draw the same token.) `probs` None: the
    weights are not stored; `block_sums` holds their blocks' sums and `block_of(first,
    stop)` gives the block's weights."""
    if probs is not None:
        block_cum = np.cumsum(
            np.add.reduceat(probs, np.arange(0, probs.shape[0], DRAW_BLOCK)) if block_sums is None else block_sums
        )
    else:
        assert block_sums is not None and block_of is not None
        block_cum = np.cumsum(block_sums)
    j = min(int(np.searchsorted(block_cum, u, side="right")), block_cum.shape[0] - 1)
    base = float(block_cum[j - 1]) if j else 0.0
    first = j * DRAW_BLOCK
    if probs is not None:
        block = probs[first : first + DRAW_BLOCK]
    else:
        assert block_of is not None
        block = block_of(first, first + DRAW_BLOCK)
    i = int(np.searchsorted(base + np.cumsum(block), u, side="right"))
    return first + min(i, block.shape[0] - 1)
