"""The sampling chain, in numpy, instrumented.

Order (the same as llama.cpp's common sampler chain): repeat penalty -> DRY -> top-k -> top-p
-> min-p -> temperature -> draw. Top-p sees the softmax of the candidates left by
top-k, min-p keeps tokens whose logit is at least max + ln(min_p) (p >= min_p * p_max),
temperature divides the surviving logits, and the draw uses numpy's PCG64 seeded from
the settings. Temperature 0 is greedy: the distribution sampled from is then a single
token with probability 1.

Everything a step reports is computed here from the model's logits: the raw softmax
(and its entropy) over the whole vocabulary, the distribution actually sampled from,
and the chosen token's probability and rank in both. It is written to cost a small
fraction of a forward pass whatever the settings: the exact top-K selection avoids a
full sort, with top-k off (or very large) the candidates are never sorted whole, and
the arrays of the vocabulary's size are scratch memory kept from step to step (on Gemma
3's 262,144 tokens fresh ones cost more than the arithmetic: see _Scratch).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import dry
from .settings import SamplingSettings

_LOG2E = 1.0 / math.log(2.0)


@dataclass(slots=True)
class SampleResult:
    token_id: int
    raw_top_ids: np.ndarray
    raw_top_probs: np.ndarray
    sampled_top_ids: np.ndarray
    sampled_top_probs: np.ndarray
    raw_prob: float
    raw_rank: int
    sampled_prob: float
    sampled_rank: int
    raw_entropy: float  # bits
    sampled_entropy: float  # bits
    kept: int  # candidates with non-zero probability in the sampled-from distribution


class _Scratch(threading.local):
    """Arrays of the vocabulary's size, reused from step to step (one set per thread).

    A new array that large is new memory: glibc hands freed blocks of a few MB back to
    the system, so each fresh one page-faults on every 4 KiB page it writes. On Gemma 3's
    262,144-token vocabulary those faults cost more than the arithmetic: the top-k 40
    chain took 1.6 ms a step with fresh arrays, 0.7 ms with memory kept. Every result
    that leaves `sample` is a fresh (small) array, never one of these.
    """

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def get(self, name: str, n: int, dtype: type) -> np.ndarray:
        """An uninitialised array of n entries: a view of this thread's `name` buffer."""
        a = self.arrays.get(name)
        if a is None or a.shape[0] < n:
            a = self.arrays[name] = np.empty(n, dtype=dtype)
        return a[:n]


_scratch = _Scratch()


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
            cand = np.flatnonzero(np.greater_equal(x, threshold, out=_scratch.get("mask", n, np.bool_)))
    if cand is None:
        cand = np.arange(n)
    sub = x[cand]
    if sub.shape[0] > k:
        part = np.argpartition(sub, sub.shape[0] - k)[sub.shape[0] - k :]
        cand = cand[part]
        sub = sub[part]
    order = np.argsort(-sub, kind="stable")
    return cand[order]


#: Above this many candidates the chain does not sort them: with top-k off a full sort
#: of the vocabulary cost ~6.5 ms a step on a 49,152-token model, a third of a pass.
SORT_LIMIT = 1024


def _top_set(work: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, in no particular order (all of them if k >= n)."""
    n = work.shape[0]
    return np.arange(n) if k >= n else np.argpartition(work, n - k)[n - k :]


#: top-p first tries this many of the largest logits (see _top_p_set) ...
_TOP_P_HEAD = 64
#: ... then about this many, above a threshold taken from a strided sample
_TOP_P_DEEP = 8192
_TOP_P_STRIDE = 32


def _top_p_set(work: np.ndarray, cand: np.ndarray | None, top_p: float) -> np.ndarray:
    """The top-p candidates of `cand` (unsorted; None: the whole vocabulary): what a sort
    by logit, largest first (equal logits in id order), keeps up to and including the
    token at which the softmax mass reaches top_p, found without sorting them all.

    Only the total mass needs every token (in float64, as the reference). The cut-off
    is looked for among the largest logits first: the exact top _TOP_P_HEAD (a sharp
    distribution ends there), then every token at or above a threshold that about
    _TOP_P_DEEP reach (a flat one: a base model, or a high temperature that drifted the
    text), used only if those tokens do hold top_p of the mass (summed exactly): all
    tokens below it are then below the cut-off. Else, or within that set, the bins of
    _top_p_bins find it. The float64 arrays are scratch memory (see _Scratch)."""
    src = work if cand is None else work[cand]  # float32
    m = src.shape[0]
    mx = float(src.max())
    # q = exp(float64(logit) - max): one pass from float32 to float64 (the same bits)
    q = np.subtract(src, mx, out=_scratch.get("f64b", m, np.float64), dtype=np.float64)
    np.exp(q, out=q)
    target = top_p * float(q.sum())
    if m > _TOP_P_HEAD:
        pos = top_indices(src, _TOP_P_HEAD)
        ids = pos if cand is None else cand[pos]
        order = np.lexsort((ids, -src[pos]))  # largest first, equal ones by id
        cum = np.cumsum(q[pos[order]])
        n_keep = int(np.searchsorted(cum, target, side="left")) + 1
        if n_keep < _TOP_P_HEAD:  # reached inside the head (its last entry may tie with the next)
            return ids[order[:n_keep]]
    sample = src[::_TOP_P_STRIDE]
    j = _TOP_P_DEEP // _TOP_P_STRIDE
    if sample.shape[0] > 4 * j:
        threshold = np.partition(sample, sample.shape[0] - 1 - j)[sample.shape[0] - 1 - j]
        mask = np.greater_equal(src, threshold, out=_scratch.get("mask", m, np.bool_))
        sub = np.flatnonzero(mask)  # in id order
        q_sub = q[sub]
        if float(q_sub.sum()) >= target:
            kept = sub[_top_p_bins(src[sub], q_sub, target)]
            return kept if cand is None else cand[kept]
    kept = _top_p_bins(src, q, target)
    return kept if cand is None else cand[kept]


def _top_p_bins(x: np.ndarray, q: np.ndarray, target: float, bins: int = 2048) -> np.ndarray:
    """Positions in x (float32 logits; q their masses exp(x - max), float64) of what a
    stable sort by logit, largest first, keeps until the mass reaches target (unsorted).
    The logits go into bins of equal width (a bin index is monotone in the logit, so a
    higher bin holds only larger logits); the bins' masses, summed from the top, point
    to the bin where the target is reached; every token above it is kept, and only the
    tokens of that bin are sorted."""
    c = x.shape[0]
    mx, lo = float(x.max()), float(x.min())
    if mx > lo:
        vals = _scratch.get("f64a", c, np.float64)
        vals[...] = x
        vals -= lo  # the bin index (vals - lo) * (bins / (mx - lo)), in place
        vals *= bins / (mx - lo)
        idx = _scratch.get("intp", c, np.intp)
        np.copyto(idx, vals, casting="unsafe")  # truncation, as astype(np.intp)
        np.minimum(idx, bins - 1, out=idx)
    else:
        idx = np.zeros(c, dtype=np.intp)
    from_top = np.cumsum(np.bincount(idx, weights=q, minlength=bins)[::-1])
    b = bins - 1 - min(int(np.searchsorted(from_top, target, side="left")), bins - 1)
    mass_above = float(from_top[bins - 2 - b]) if b < bins - 1 else 0.0
    mask = _scratch.get("mask", c, np.bool_)
    inside = np.flatnonzero(np.equal(idx, b, out=mask))
    order = inside[np.argsort(-x[inside], kind="stable")]
    cum = mass_above + np.cumsum(q[order])
    n_keep = min(int(np.searchsorted(cum, target, side="left")) + 1, order.shape[0])
    return np.concatenate([np.flatnonzero(np.greater(idx, b, out=mask)), order[:n_keep]])


def _unsorted_distribution(
    work: np.ndarray, cand: np.ndarray | None, settings: SamplingSettings
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, float, float]:
    """The rest of the chain for more than SORT_LIMIT candidates (top-k and top-p done;
    cand None: the whole vocabulary): (candidates, None if they are still the whole
    vocabulary; their weights, exp(z) not yet divided by their sum: the caller divides
    only the few it reports, a pass over the vocabulary saved; the sums of their blocks
    of DRAW_BLOCK; their total, the weights' sum; entropy in bits). Min-p is a threshold and
    temperature a scale, neither needs an order: the candidates stay in the order they
    come (the same for the same logits and settings, so a seed still draws the same
    tokens). The same arithmetic as (logits - max) / temperature, done in place."""
    src = work if cand is None else work[cand]  # float32
    m = src.shape[0]
    mx = float(src.max())
    z = _scratch.get("f64a", m, np.float64)
    if settings.min_p > 0.0:
        z[...] = src
        # in float64, as written: logit >= max + ln(min_p)
        keep = np.greater_equal(z, mx + math.log(settings.min_p), out=_scratch.get("mask", m, np.bool_))
        cand = np.flatnonzero(keep) if cand is None else cand[keep]
        z = z[keep]
        z -= mx
    else:
        np.subtract(src, mx, out=z, dtype=np.float64)  # float64(logit) - max in one pass
    if settings.temperature != 1.0:  # (dividing by 1 changes nothing)
        z /= settings.temperature
    weights = np.exp(z, out=_scratch.get("f64b", z.shape[0], np.float64))
    # their sum from the draw's block sums (one pass serves both: see _draw_unsorted)
    blocks = np.add.reduceat(weights, np.arange(0, weights.shape[0], DRAW_BLOCK))
    norm = float(blocks.sum())
    # entropy in nats is ln(norm) - sum(w z) / norm: no logarithm per candidate. einsum
    # sums the products without a temporary array and without BLAS (np.dot would call
    # BLAS, whose threads spin against llama.cpp's)
    entropy = (math.log(norm) - float(np.einsum("i,i->", weights, z)) / norm) * _LOG2E if z.shape[0] > 1 else 0.0
    return cand, weights, blocks, norm, max(entropy, 0.0)


#: the unsorted path's draw sums its probabilities in blocks of this many
DRAW_BLOCK = 1024


def _draw_unsorted(probs: np.ndarray, u: float, block_sums: np.ndarray | None = None) -> int:
    """The index searchsorted(cumsum(probs), u, side="right") finds (the last one if
    rounding leaves u past the end), without a cumulative sum of the whole array: on a
    262,144-token vocabulary that sum alone cost 0.6 ms. Block sums point to the block
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


def entropy_bits(logits: np.ndarray) -> float:
    """Entropy in bits of softmax(logits), computed stably in float64."""
    z = logits.astype(np.float64, copy=False)
    z = z - z.max()
    e = np.exp(z)
    total = e.sum()
    return float((math.log(total) - float(np.dot(e, z)) / total) * _LOG2E)


def make_rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def sample(
    logits: np.ndarray,
    recent_tokens: Sequence[int],
    settings: SamplingSettings,
    rng: np.random.Generator,
    report_k: int = 10,
    force: int | None = None,
) -> SampleResult:
    """Run the chain on one row of logits (float32, n_vocab) and report everything.

    `force`: the token is this one (picked by hand in step mode), not drawn: `rng` is
    not used, and the token's probabilities and ranks are reported as for a drawn one
    (a token the filters cut has sampled_prob 0 and sampled_rank 0)."""
    n_vocab = logits.shape[0]

    # --- raw softmax over the whole vocabulary ---------------------------------
    raw_max = float(logits.max())
    shifted = np.subtract(logits, np.float32(raw_max), out=_scratch.get("shifted", n_vocab, np.float32))
    e = np.exp(shifted, out=_scratch.get("exp", n_vocab, np.float32))
    total = float(e.sum())
    # (einsum, not np.dot: a BLAS call, whose threads would spin against llama.cpp's)
    raw_entropy = (math.log(total) - float(np.einsum("i,i->", e, shifted)) / total) * _LOG2E

    raw_top_ids = top_indices(logits, report_k)
    # --- repeat penalty, then DRY (dry.py), on a copy: the raw one stays raw -----
    work = logits
    if settings.repeat_penalty != 1.0 and settings.repeat_last_n > 0 and recent_tokens:
        recent = {t for t in recent_tokens[-settings.repeat_last_n :] if 0 <= t < n_vocab}
        if recent:
            ids = np.fromiter(recent, dtype=np.intp, count=len(recent))
            work = _scratch.get("work", n_vocab, np.float32)
            np.copyto(work, logits)
            v = work[ids]
            work[ids] = np.where(v > 0, v / settings.repeat_penalty, v * settings.repeat_penalty)
    work = dry.apply(work, logits, recent_tokens, settings, _scratch)

    # --- top-k: candidates sorted by (penalized) logit, largest first -----------
    # (a large candidate set is never sorted whole: see _top_p_set, _unsorted_distribution)
    k = 1 if settings.greedy else settings.top_k
    if k <= 0 or k > n_vocab:
        k = n_vocab  # top-k off
    raw_top_probs = e[raw_top_ids].astype(np.float64) / total
    top_p_done = False
    unsorted = False
    norm = 1.0  # what probs must still be divided by (the unsorted path leaves them unnormalised)
    if k > SORT_LIMIT and not settings.greedy:
        # top-k off: cand None stands for the whole vocabulary, read in place (an index
        # array and a gathered copy of it cost ~0.3 ms on a 262,144-token vocabulary)
        cand = None if k >= n_vocab else _top_set(work, k)
        if settings.top_p < 1.0:
            cand = _top_p_set(work, cand, settings.top_p)
        if cand is None or cand.shape[0] > SORT_LIMIT:
            unsorted = True
        else:
            cand = cand[np.argsort(-work[cand], kind="stable")]  # few left: the sorted path
            top_p_done = True
    elif work is logits and k <= report_k:
        cand = raw_top_ids[:k]
    else:
        cand = top_indices(work, k)

    if unsorted:
        kept_ids, probs, block_sums, norm, sampled_entropy = _unsorted_distribution(work, cand, settings)
        # only the reported candidates are sorted. Every token kept: the probabilities
        # rise with the logits, so the top logits (float32, half the bytes) are the top
        # probabilities, and without a penalty they are the raw top already
        if kept_ids is not None:
            top = top_indices(probs, report_k)
        elif work is logits:
            top = raw_top_ids
        else:
            top = top_indices(work, report_k)
    else:
        cand_logits = work[cand].astype(np.float64)
        if settings.greedy:
            kept_ids = cand[:1]
            probs = np.ones(1)
        else:
            # --- top-p on the softmax of what top-k left -------------------------
            if settings.top_p < 1.0 and cand.shape[0] > 1 and not top_p_done:
                p = np.exp(cand_logits - cand_logits[0])
                cum = np.cumsum(p)
                cum /= cum[-1]
                n_keep = int(np.searchsorted(cum, settings.top_p, side="left")) + 1
                n_keep = min(max(n_keep, 1), cand.shape[0])
                cand, cand_logits = cand[:n_keep], cand_logits[:n_keep]
            # --- min-p: logit >= max + ln(min_p) ---------------------------------
            if settings.min_p > 0.0 and cand.shape[0] > 1:
                floor = cand_logits[0] + math.log(settings.min_p)
                n_keep = max(int(np.count_nonzero(cand_logits >= floor)), 1)
                cand, cand_logits = cand[:n_keep], cand_logits[:n_keep]
            # --- temperature, then the distribution actually sampled from -------
            z = (cand_logits - cand_logits[0]) / settings.temperature
            probs = np.exp(z)
            probs /= probs.sum()
            kept_ids = cand
        nz = probs[probs > 0]
        sampled_entropy = float(-(nz * np.log2(nz)).sum()) if nz.shape[0] > 1 else 0.0
        top = np.arange(min(report_k, kept_ids.shape[0]))  # already sorted

    # --- draw --------------------------------------------------------------------
    # kept_ids None: every token kept, in order (a token's index is its id; no
    # np.arange of the vocabulary is made)
    n_kept = probs.shape[0]
    pick: int | None
    if force is not None:
        token_id = int(force)
        if kept_ids is None:
            pick = token_id
        else:
            where = np.flatnonzero(kept_ids == token_id)
            pick = int(where[0]) if where.size else None  # None: the filters cut it
    else:
        if n_kept == 1:
            pick = 0
        elif unsorted:
            pick = _draw_unsorted(probs, rng.random() * norm, block_sums)
        else:
            u = rng.random()
            pick = int(np.searchsorted(np.cumsum(probs), u, side="right"))
            pick = min(pick, n_kept - 1)
        token_id = pick if kept_ids is None else int(kept_ids[pick])

    chosen_logit = logits[token_id]
    mask = _scratch.get("mask", max(n_vocab, n_kept), np.bool_)
    raw_rank = int(np.count_nonzero(np.greater(logits, chosen_logit, out=mask[:n_vocab]))) + 1
    if pick is None:
        sampled_rank = 0
    elif kept_ids is None and work is logits:
        # every token kept, no penalty: the probabilities rise with the raw logits, so
        # the ranks are the same (a pass over the vocabulary saved)
        sampled_rank = raw_rank
    else:
        sampled_rank = int(np.count_nonzero(np.greater(probs, probs[pick], out=mask[:n_kept]))) + 1
    return SampleResult(
        token_id=token_id,
        raw_top_ids=raw_top_ids,
        raw_top_probs=raw_top_probs,
        sampled_top_ids=top if kept_ids is None else kept_ids[top],
        sampled_top_probs=probs[top] / norm,
        raw_prob=float(e[token_id]) / total,  # as raw_top_probs: the same token, the same number
        raw_rank=raw_rank,
        sampled_prob=0.0 if pick is None else float(probs[pick]) / norm,
        sampled_rank=sampled_rank,
        raw_entropy=float(raw_entropy),
        sampled_entropy=sampled_entropy,
        kept=int(n_kept),
    )
