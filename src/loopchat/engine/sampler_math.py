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
    fused = sampler_fused.top_k(x, k)  # (the kernel's one pass, where it is this answer)
    if fused is not None:
        return fused
    cand: np.ndarray | None = None
    if n > 4096 and (n + 31) // 32 > k:
        # (the sample's k-th largest: the kernel's heap over x[::32], or numpy's partition)
        cand = sampler_fused.at_least(x, sampler_fused.sample_top(x, 32, k)[k - 1])
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


#: top-p first tries this many of the largest logits (see top_p_positions) ...
_TOP_P_HEAD = 64
#: ... then about this many, above a threshold taken from a strided sample
_TOP_P_DEEP = 8192
_TOP_P_STRIDE = 32


def top_p_positions(
    work: np.ndarray,
    cand: np.ndarray | None,
    top_p: float,
    known_max: float | None = None,
    approx: tuple[float, float] | None = None,
    src: np.ndarray | None = None,
    inside: list | None = None,
    exps: np.ndarray | None = None,
    top_out: list | None = None,
    scaled: bool = False,
    sample: np.ndarray | None = None,
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
    top_p_bins find it. On a large vocabulary one pass (sampler_fused.exp_sum_above) sums
    the masses and keeps the deep set's with their positions (and stores every mass, read
    only where the deep set does not hold top_p): the head is found inside it. The float64
    arrays are scratch memory (see sampler_scratch).

    `approx`: (an estimate of the candidates' total mass exp(logit - shift) to 1e-5, the
    shift): where it says the most likely token alone holds top_p, the total is summed
    with no deep set or search (if the estimate was wrong, the search follows). Either way
    the same numbers: the estimate only chooses what is computed.

    Returns the kept candidates, as positions into their logits `src` (work[cand]; with cand
    None their ids: the TopP stage gathers their ids and logits in one pass, sampler_topp; the
    kernel's bins over every candidate leave them in scratch memory, the next call's), and
    the share of the candidates' softmax mass they hold (both sums in float64, found on the way).
    With the kernel the search from the sample to the bins is its one call (_top_p_fused).
    `known_max`: the candidates' largest logit, if the caller knows it. `inside`: what the search
    knows of the most likely candidate it cut is appended to it: ("at", its position), where the
    kernel's bins found it (top_p_cut's `cut_out`); ("deep", the deep set's positions, ascending,
    their logits, the kept ones as positions into the deep set), where the cut fell inside the deep
    set (every candidate outside it has a smaller logit than every one in it: the most likely one
    cut is the deep set's, if it holds one not kept); nothing else. `exps`: exp(float64(src) - the candidates'
    largest logit), float64, as this search computes them (the constraint's pass's: sampler_constraint), read
    instead of computed (the kernel's `stored` passes: the same sums, in the same order); None: computed.
    `top_out` ([the reported top's size]): where the kernel's call ran, its top of the kept logits is appended
    (sampler_fused.top_p_deep's last answer: top_indices(src[kept], size), or None where not found).
    `scaled`: `exps` are at a larger shift, every mass times one factor (Candidates.scaled_exps_of): the
    kernel's one call reads them (its unit the most likely candidate's mass: the same kept set, up to the
    rounding of a running sum within an ulp or two of the target); any other step computes its own.
    `sample`: src[::32] (the constraint's pass wrote it beside src), which the kernel's call reads instead of
    src's strided values."""
    if src is None:  # (given: work[cand] as the constraint's pass gathered it, Candidates.source())
        src = work if cand is None else work[cand]  # float32
    mx = float(src.max()) if known_max is None else known_max
    if approx is not None and top_p * approx[0] * math.exp(approx[1] - mx) * _MARGIN <= 1.0:
        at_mx = None if scaled else exps
        total = sampler_fused.exp_sum(src, mx, None) if at_mx is None else sampler_fused.stored_sum(src, at_mx)
        if top_p * total <= 1.0:  # (a sharp distribution: no search at all)
            return _first_max(src, None), 1.0 / total
    fused = _top_p_fused(src, cand, top_p, mx, inside, exps, top_out, scaled, sample)
    if fused is not None:
        return fused[0], fused[1] / fused[2]
    exps = None if scaled else exps
    above = _deep_sample(src)
    if above is None:
        kept, mass, total = _top_p_stored(src, cand, top_p, mx, exps)
    else:
        kept, mass, total = _top_p_deep(src, cand, top_p, mx, above, inside, exps)
    return kept, mass / total


def _top_p_fused(
    src: np.ndarray,
    cand: np.ndarray | None,
    top_p: float,
    mx: float,
    inside: list | None,
    exps: np.ndarray | None,
    top_out: list | None = None,
    scaled: bool = False,
    sample: np.ndarray | None = None,
) -> tuple[np.ndarray, float, float] | None:
    """_deep_sample and _top_p_deep in one call of the kernel (sampler_fused.top_p_deep: their steps one
    for one, each sum in their order), the head's cut left to _deep_rest where it may end there (or where
    the kernel's bins refused): (the kept positions, their mass, the total), as _top_p_deep's. None: no
    kernel, or no deep set: the steps above decide (and where `scaled` exps left the rest to them)."""
    q = scratch.get("f64b", src.shape[0], np.float64) if exps is None else exps
    r = sampler_fused.top_p_deep(src, mx, top_p, q, exps is not None, top_out[0] if top_out else 0, sample)
    if r is None:
        return None
    how, total, mass, kept, local, cut, deep, top = r
    if how == "rest" and scaled:  # (numpy's steps from the start, on masses of their own)
        return None
    if top_out is not None:
        top_out.append(top)
    if how == "rest":
        return _deep_rest(src, cand, top_p * total, deep[:3], (q, total, deep[3]), inside)
    if inside is not None and how != "first":
        if cut >= 0:
            inside.append(("at", cut))
        elif how in ("deep", "head"):
            inside.append(("deep", deep[0], deep[1], local))
    return kept, mass, total


#: an estimate's margin: it must say the most likely token holds more than this times the
#: target (the estimate from float32 exps is within 1e-5 of the total: see TopP)
_MARGIN = 1.0 + 1e-4


def _first_max(src: np.ndarray, cand: np.ndarray | None) -> np.ndarray:
    """The most likely token alone (its q is exp(0) = 1): the first of equal ones, as the
    sort puts them."""
    top = int(np.argmax(src))
    return np.array([top if cand is None else cand[top]], dtype=np.intp)


def _deep_sample(src: np.ndarray) -> np.ndarray | None:
    """The j + 1 largest of a strided sample of src (j = _TOP_P_DEEP / _TOP_P_STRIDE),
    largest first: the last the deep set's threshold, the _TOP_P_HEAD-th the head's; None:
    src too small for a deep set."""
    s, j = (src.shape[0] + _TOP_P_STRIDE - 1) // _TOP_P_STRIDE, _TOP_P_DEEP // _TOP_P_STRIDE
    return sampler_fused.sample_top(src, _TOP_P_STRIDE, j + 1) if s > 4 * j else None


def _head_cut(
    src: np.ndarray, cand: np.ndarray | None, pos: np.ndarray, q: np.ndarray, target: float
) -> tuple[np.ndarray, float] | None:
    """The cut-off inside the head (`pos`: the exact top _TOP_P_HEAD of src, q their
    masses): (the kept positions, their mass), or None where the head does not reach it."""
    ids = pos if cand is None else cand[pos]
    order = np.lexsort((ids, -src[pos]))  # largest first, equal ones by id
    cum = np.cumsum(q[order])
    n_keep = int(np.searchsorted(cum, target, side="left")) + 1
    if n_keep < _TOP_P_HEAD:  # reached inside the head (its last entry may tie with the next)
        return pos[order[:n_keep]], float(cum[n_keep - 1])
    return None


def _top_p_stored(
    src: np.ndarray, cand: np.ndarray | None, top_p: float, mx: float, exps: np.ndarray | None = None
) -> tuple[np.ndarray, float, float]:
    """top_p_positions without a deep set: the masses stored (or `exps`, given), the head, then the bins.
    (kept positions of src, their mass, the total)."""
    if exps is None:
        q = scratch.get("f64b", src.shape[0], np.float64)
        total = sampler_fused.exp_sum(src, mx, q)
    else:
        q, total = exps, sampler_fused.stored_sum(src, exps)
    target = top_p * total
    if target <= 1.0:
        return _first_max(src, None), 1.0, total
    if src.shape[0] > _TOP_P_HEAD:
        pos = top_indices(src, _TOP_P_HEAD)
        cut = _head_cut(src, cand, pos, q[pos], target)
        if cut is not None:
            return (*cut, total)
    kept, mass = top_p_bins(src, q, target)
    return kept, mass, total


def _top_p_deep(
    src: np.ndarray,
    cand: np.ndarray | None,
    top_p: float,
    mx: float,
    above: np.ndarray,
    inside: list | None = None,
    exps: np.ndarray | None = None,
) -> tuple[np.ndarray, float, float]:
    """top_p_positions on a large vocabulary: one pass for the total and the deep set (the
    positions at or above above[-1], with their masses), the head found inside it (the
    positions at or above the sample's top _TOP_P_HEAD-th: as top_indices takes them),
    the bins inside it where it holds top_p, else over everything (the masses stored by the
    same pass). `inside`, `exps`: as top_p_positions's (exps: the masses read, not computed)."""
    # (every mass stored on the way, 8 bytes a token written: where the deep set does not hold
    # top_p, the bins below need them all, and a second exp pass over src is saved)
    q = scratch.get("f64b", src.shape[0], np.float64) if exps is None else exps
    total, deep, q_deep = sampler_fused.exp_sum_above(src, mx, above[-1], q, exps is not None)
    target = top_p * total
    x_deep = src[deep]
    if target <= 1.0:  # (every token of the largest logit is in the deep set, in order)
        return deep[int(np.argmax(x_deep)) : int(np.argmax(x_deep)) + 1], 1.0, total
    return _deep_rest(src, cand, target, (deep, x_deep, q_deep), (q, total, above[_TOP_P_HEAD - 1]), inside)


def _deep_rest(
    src: np.ndarray, cand: np.ndarray | None, target: float, ds: tuple, qs: tuple, inside: list | None
) -> tuple[np.ndarray, float, float]:
    """_top_p_deep from its deep set on (`ds`: its positions, logits and masses; `qs`: every mass, the
    total, the head's threshold), where the target is above 1: the head's cut, else the bins."""
    deep, x_deep, q_deep = ds
    q, total, a_head = qs
    if target <= _TOP_P_HEAD:  # (each mass is at most 1: a head holds no more than its size)
        head = np.flatnonzero(x_deep >= a_head)
        # (the head is among these: where they all hold less than the target, by more than their
        # sums' rounding, the head's cut is not looked for, as it would not be found: a flat row's)
        if float(q_deep[head].sum()) * (1.0 + 1e-9) >= target:
            # (the kernel's heap where the 65 largest are distinct: the same 64 in the same order; the
            # head's cut only where the 64 hold the target, by the same margin, or it would not be found)
            at = sampler_fused.top_k(x_deep, _TOP_P_HEAD)
            at = _top_of(x_deep, head, _TOP_P_HEAD) if at is None else at
            q_at = q_deep[at]
            cut = _head_cut(src, cand, deep[at], q_at, target) if float(q_at.sum()) * (1.0 + 1e-9) >= target else None
            if cut is not None:
                if inside is not None:
                    inside.append(("deep", deep, x_deep, np.searchsorted(deep, cut[0])))
                return (*cut, total)
    nxt: list | None = None if inside is None else []
    if float(q_deep.sum()) >= target:
        kept, mass = top_p_bins(x_deep, q_deep, target, cut_out=nxt)
        if inside is not None:
            inside.append(("at", int(deep[nxt[0]])) if nxt and nxt[0] >= 0 else ("deep", deep, x_deep, kept))
        return deep[kept], mass, total
    kept, mass = top_p_bins(src, q, target, cut_out=nxt)
    if inside is not None and nxt and nxt[0] >= 0:
        inside.append(("at", nxt[0]))
    return kept, mass, total


def top_p_bounded(
    work: np.ndarray, top_p: float, mx: float, total_lo: float, total_hi: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """top_p_positions over the whole vocabulary (cand None) without its float64 exp of every logit,
    where the total lies in [total_lo, total_hi] (the sum of exp(float64(work) - mx): see
    sampler_raw.total_bounds) and that bracket decides the cut. The tokens at or above a
    sampled threshold (a shallow set, then _top_p_deep's deep set) by a compare pass, the float64
    exps of those alone, then the head's cut (a sharp distribution's) or the bins' (top_p_bins)
    inside them, for the bracket's upper end: their kept tokens are the top_p set for every
    total in the bracket where the sum they reach is at or above the upper end and the sum
    before the last of them (in their order: largest logit first, equal ones by position) below
    the lower end, each by a margin above the sums' rounding (so that any order of addition
    decides alike: the reference's sort and cumsum, the full pass's bins). Returns (the kept
    ids, as top_p_positions's; the set searched, whose tokens not kept hold the most likely one cut,
    if any), or None: the bracket leaves the cut open, or the set may not hold top_p (the caller
    runs top_p_positions: its full pass decides)."""
    lo, hi = top_p * total_lo, top_p * total_hi
    if hi <= 1.0:  # (the most likely token alone holds top_p, at either end)
        return _first_max(work, None), np.empty(0, dtype=np.intp)
    above = _deep_sample(work)
    if lo <= 1.0 or above is None:
        return None
    # a shallow set first (the tokens at or above the sample's _TOP_P_SHALLOW-th: some 768), used
    # only where it holds no more than SORT_LIMIT tokens (the kept ones are then sorted: their
    # order is the sort's), then the deep set (where more may be kept, in _top_p_deep's order)
    for level, threshold in enumerate((above[_TOP_P_SHALLOW - 1], above[-1])):
        deep = sampler_fused.at_least(work, threshold)
        if level == 0 and deep.shape[0] > SORT_LIMIT:
            continue
        x_deep = work[deep]
        q_deep = scratch.get("deep_q", x_deep.shape[0], np.float64)
        sampler_fused.exp_sum(x_deep, mx, q_deep)
        # (a float64 sum of m terms in any order is within (m - 1) 2^-53 of the exact one: the
        # bins' sums over the deep set and their 2,048 bins, the reference's cumsum, the full pass's)
        margin = 2.0**-52 * (x_deep.shape[0] + 4096)
        if float(q_deep.sum()) >= hi * (1.0 + margin):
            kept = _bounded_cut(work, deep, x_deep, q_deep, above, (lo * (1.0 - margin), hi * (1.0 + margin)))
            return None if kept is None else (kept, deep)
    return None  # (the deep set may not hold top_p: the full pass decides)


#: top_p_bounded's shallow set: the tokens at or above this entry of the deep set's sample
_TOP_P_SHALLOW = 24


def _bounded_cut(
    work: np.ndarray,
    deep: np.ndarray,
    x_deep: np.ndarray,
    q_deep: np.ndarray,
    above: np.ndarray,
    bracket: tuple[float, float],
) -> np.ndarray | None:
    """top_p_bounded's cut inside the deep set `deep` (x_deep, q_deep: its logits and masses),
    which holds top_p: the head's (where the target may end there; `deep` holds the top
    _TOP_P_HEAD where it holds as many) or the bins' kept ids for the bracket's upper end, None
    where the lower end would keep fewer."""
    lo, hi = bracket
    # (_top_p_deep's head first: a sharp distribution ends there)
    if hi <= _TOP_P_HEAD and deep.shape[0] >= _TOP_P_HEAD:
        at = _top_of(x_deep, np.flatnonzero(x_deep >= above[_TOP_P_HEAD - 1]), _TOP_P_HEAD)
        head = _head_cut(work, None, deep[at], q_deep[at], hi)
        if head is not None:  # (its last kept token, by its position in the deep set)
            last = int(np.searchsorted(deep, head[0][-1]))
            return head[0] if head[1] - float(q_deep[last]) < lo else None
    kept, mass = top_p_bins(x_deep, q_deep, hi)
    v = x_deep[kept]
    last = int(kept[np.flatnonzero(v == v.min())].max())
    return deep[kept] if mass - float(q_deep[last]) < lo else None


def top_p_bins(
    x: np.ndarray, q: np.ndarray, target: float, bins: int = 2048, cut_out: list | None = None
) -> tuple[np.ndarray, float]:
    """Positions in x (float32 logits; q their masses exp(x - max), float64) of what a
    stable sort by logit, largest first, keeps until the mass reaches target (unsorted).
    The logits go into bins of equal width (a bin index is monotone in the logit, so a
    higher bin holds only larger logits); the bins' masses, summed from the top, point
    to the bin where the target is reached; every token above it is kept, and only the
    tokens of that bin are sorted. Also returns the kept tokens' mass (the sum of their q).
    The kernel does it all in one call (sampler_fused.top_p_cut), the same steps; `cut_out`: as
    its (the kernel's alone: numpy's steps append nothing)."""
    fused = sampler_fused.top_p_cut(x, q, target, bins, cut_out)
    if fused is not None:
        return fused
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
