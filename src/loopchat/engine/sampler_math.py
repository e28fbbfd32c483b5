"""The numeric pieces the sampler's stages are built from, each written to cost a small
fraction of a forward pass on a large vocabulary: an exact top-K that does not sort the
vocabulary, the top-p cut-off found without sorting the candidates, a draw without a
cumulative sum of the vocabulary. Their passes over the whole vocabulary are
sampler_fused's (the C kernel or numpy), their arrays scratch memory (sampler_scratch).
"""

from __future__ import annotations

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
            cand = np.flatnonzero(np.greater_equal(x, threshold, out=scratch.get("mask", n, np.bool_)))
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
    work: np.ndarray, cand: np.ndarray | None, top_p: float, known_max: float | None = None
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

    Returns the kept candidates and the share of the candidates' softmax mass they hold
    (both sums in float64, found on the way). `known_max`: the candidates' largest logit,
    if the caller knows it."""
    src = work if cand is None else work[cand]  # float32
    m = src.shape[0]
    mx = float(src.max()) if known_max is None else known_max
    # q = exp(float64(logit) - max), one pass (sampler_fused)
    q = scratch.get("f64b", m, np.float64)
    total = sampler_fused.exp_sum(src, mx, q)
    target = top_p * total
    if target <= 1.0:
        # the most likely token alone holds top_p (its q is exp(0) = 1): the first of
        # equal ones, as the sort puts them (a sharp distribution: no search at all)
        top = int(np.argmax(src))
        return np.array([top if cand is None else cand[top]], dtype=np.intp), 1.0 / total
    above = None
    if m > _TOP_P_HEAD:
        sample = src[::_TOP_P_STRIDE]
        s, j = sample.shape[0], _TOP_P_DEEP // _TOP_P_STRIDE
        if s > 4 * j:
            # one partition of the sample gives the deep set's threshold and the head's (as
            # top_indices takes it: the same candidates, in a pass of sampler_fused)
            above = np.partition(sample, s - 1 - j)[s - 1 - j :]  # the sample's j + 1 largest
            head_threshold = np.partition(above, j + 1 - _TOP_P_HEAD)[j + 1 - _TOP_P_HEAD]
            pos = _top_of(src, sampler_fused.at_least(src, head_threshold), _TOP_P_HEAD)
        else:
            pos = top_indices(src, _TOP_P_HEAD)
        ids = pos if cand is None else cand[pos]
        order = np.lexsort((ids, -src[pos]))  # largest first, equal ones by id
        cum = np.cumsum(q[pos[order]])
        n_keep = int(np.searchsorted(cum, target, side="left")) + 1
        if n_keep < _TOP_P_HEAD:  # reached inside the head (its last entry may tie with the next)
            return ids[order[:n_keep]], float(cum[n_keep - 1]) / total
    if above is not None:
        deep = sampler_fused.at_least(src, above[0])  # in id order
        q_sub = q[deep]
        if float(q_sub.sum()) >= target:
            kept, mass = top_p_bins(src[deep], q_sub, target)
            kept = deep[kept]
            return (kept if cand is None else cand[kept]), mass / total
    kept, mass = top_p_bins(src, q, target)
    return (kept if cand is None else cand[kept]), mass / total


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


def draw_unsorted(probs: np.ndarray, u: float, block_sums: np.ndarray | None = None) -> int:
    """The index searchsorted(cumsum(probs), u, side="right") finds (the last one if
    rounding leaves u past the end), without a cumulative sum of the whole array (its
    cost on a large vocabulary: docs/performance.md, "Figures behind the code's choices",
    "The sampler's numpy"). Block sums point to the block
    where the running total passes u, and only that block is summed one by one. (The
    sums are rounded in another order: a u within a few ulps of a boundary may pick the
    neighbour; the same logits and seed still draw the same token.)"""
    n = probs.shape[0]
    starts = np.arange(0, n, DRAW_BLOCK)
    block_cum = np.cumsum(np.add.reduceat(probs, starts) if block_sums is None else block_sums)
    j = min(int(np.searchsorted(block_cum, u, side="right")), starts.shape[0] - 1)
    base = float(block_cum[j - 1]) if j else 0.0
    first = int(starts[j])
    block = probs[first : first + DRAW_BLOCK]
    i = int(np.searchsorted(base + np.cumsum(block), u, side="right"))
    return first + min(i, block.shape[0] - 1)
