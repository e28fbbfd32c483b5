"""The sampler's passes over the whole vocabulary, each one call: the C kernel
(_sampler_kernel.c, built by setup.py when a compiler is there) or, without it, numpy.

Both paths compute the same numbers: the numpy one is the arithmetic the chain did before
the kernel, pass by pass; the kernel fuses the passes and uses its own exp (within 2 ulp of
numpy's), multiplies by 1/t where numpy divides by t, and adds in its own order, so its
floats differ from numpy's in the last bits; its positions, bins and bins' sums are numpy's
bit for bit (tests/test_sampler_kernel.py; tests/test_sampler_chain.py runs the chain both
ways against tests/reference_sampler.py). `LOOPCHAT_SAMPLER_KERNEL=0` in the environment
keeps the numpy path (a benchmark's "before"); `PATH` says which one runs.
"""

from __future__ import annotations

import os
from types import ModuleType

import numpy as np

from loopchat.engine.sampler_scratch import scratch


def _load() -> ModuleType | None:
    if os.environ.get("LOOPCHAT_SAMPLER_KERNEL", "1") == "0":
        return None
    try:
        from loopchat.engine import _sampler_kernel
    except ImportError:
        return None
    return _sampler_kernel


#: the C kernel, or None: the numpy path (tests set it to None to run that path)
kernel: ModuleType | None = _load()
PATH = "kernel" if kernel is not None else "numpy"
_threads = 1  # the kernel's count (use_threads)


def use_threads(n: int) -> None:
    """The threads the kernel's long float64 exp passes may use (exp_sum's and exp_sum_above's
    rows of 32,768 tokens and more): the engine's llama thread count for the pass just run, whose
    cores sit idle while the chain runs. 1: no helper thread; 2 or more: one (docs/performance.md,
    "The chain under a schema, sixth session"). Every result has the same bits either way: the
    sums are taken by parts in a fixed order (docs/trace-format.md, "Sums over the vocabulary")."""
    global _threads
    if kernel is not None and n != _threads:
        kernel.set_threads(n)
        _threads = n


def chain_starts() -> None:
    """A chain starts: the kernel's helper thread (where use_threads allows one) is woken now and
    polls for the chain's long passes instead of sleeping between them (for 5 ms at most, or until
    chain_ends), so the first pass after a forward pass does not wait for its wake-up."""
    if kernel is not None and _threads > 1:
        kernel.wake(5000)


def chain_ends() -> None:
    """The chain has ended: the helper sleeps again after its short poll (the forward pass's cores)."""
    if kernel is not None and _threads > 1:
        kernel.wake(0)


def exp_sum(src: np.ndarray, shift: float, out: np.ndarray | None) -> float:
    """out = exp(float64(src) - shift) for float32 src (out: float64, src's length; None: not
    kept, and the kernel does not store them); their sum."""
    if kernel is not None:
        return float(kernel.exp_sum(src, shift, out))
    if out is None:
        out = scratch.get("f64b", src.shape[0], np.float64)
    q = np.subtract(src, shift, out=out, dtype=np.float64)  # one pass from float32 (the same bits)
    np.exp(q, out=q)
    return float(q.sum())


def exp_sum_above(
    src: np.ndarray, shift: float, threshold: np.floating, full: np.ndarray | None = None, stored: bool = False
) -> tuple[float, np.ndarray, np.ndarray]:
    """One pass over float32 src: the sum of exp(float64(src) - shift) over every entry (as
    exp_sum), and the positions at or above threshold (of src's type), in order (a fresh
    array), with their exps (scratch memory): top-p's deep set. `full` (float64, src's length):
    every exp stored there too, exp_sum's `out` (the same bits), so that a deep set that does
    not hold top-p needs no second pass; None: not stored. `stored`: `full` holds those exps already
    (the kernel's constraint_scan wrote them, the same bits), read and not computed: the kernel's path alone."""
    n = src.shape[0]
    if kernel is not None:
        ids, q = scratch.get("ids", n, np.int64), scratch.get("deep_q", n, np.float64)
        total, k = kernel.exp_sum_above(src, shift, float(threshold), ids, q, full, stored)
        return float(total), ids[:k].astype(np.intp), q[:k]
    assert not stored, "stored exps come from the kernel's constraint_scan"
    q = scratch.get("f64b", n, np.float64) if full is None else full
    total = exp_sum(src, shift, q)
    deep = np.flatnonzero(np.greater_equal(src, threshold, out=scratch.get("mask", n, np.bool_)))
    return total, deep, q[deep]


def stored_sum(src: np.ndarray, exps: np.ndarray) -> float:
    """exp_sum(src, shift, None) where `exps` holds those exps already (exp_sum_above's `stored`: the
    same sum, in the same order; no position is at or above a NaN threshold)."""
    return exp_sum_above(src, 0.0, np.float32(np.nan), exps, stored=True)[0]


def distribution(x: np.ndarray, shift: float, t: float, block: int) -> tuple[np.ndarray, np.ndarray, float, float]:
    """For float32 or float64 x, z = (x - shift) / t in float64 (no division when t is 1):
    (weights exp(z), a scratch array; the sums of their blocks of `block`; the weights'
    sum; the sum of weights * z)."""
    n = x.shape[0]
    weights = scratch.get("f64b", n, np.float64)
    if kernel is not None:
        blocks = np.empty((n + block - 1) // block, dtype=np.float64)
        norm, wz = kernel.distribution(x, shift, t, weights, blocks, block)
        return weights, blocks, norm, wz
    if x.dtype == np.float64 and shift == 0.0:
        z = x if t == 1.0 else x / t  # (min-p's z: already shifted)
    else:
        z = np.subtract(x, shift, out=scratch.get("f64a", n, np.float64), dtype=np.float64)
        if t != 1.0:
            z /= t
    np.exp(z, out=weights)
    # the sum from the draw's block sums (one pass serves both: see draw_unsorted). einsum
    # sums the products without a temporary array and without BLAS (np.dot would call
    # BLAS, whose threads spin against llama.cpp's)
    blocks = np.add.reduceat(weights, np.arange(0, n, block))
    return weights, blocks, float(blocks.sum()), float(np.einsum("i,i->", weights, z))


def distribution_sums(x: np.ndarray, shift: float, t: float, block: int) -> tuple[np.ndarray, float, float]:
    """distribution's sums, the weights not kept: (the sums of the blocks of `block`; the
    weights' sum; the sum of weights * z). The kernel does not store the weights; numpy
    computes them as distribution does (the same numbers) and drops them."""
    if kernel is not None:
        blocks = np.empty((x.shape[0] + block - 1) // block, dtype=np.float64)
        norm, wz = kernel.distribution(x, shift, t, None, blocks, block)
        return blocks, norm, wz
    _, blocks, norm, wz = distribution(x, shift, t, block)
    return blocks, norm, wz


def weights_of(x: np.ndarray, shift: float, t: float) -> np.ndarray:
    """distribution's weights exp((x - shift) / t) of a few float32 logits (a gathered copy
    or a slice: a fresh float64 array), computed as distribution computes them: the kernel's
    own block pass (one block), or numpy's float64 subtract, divide and exp."""
    n = x.shape[0]
    weights = np.empty(n, dtype=np.float64)
    if kernel is not None:
        kernel.distribution(np.ascontiguousarray(x), shift, t, weights, np.empty(1, dtype=np.float64), max(n, 1))
        return weights
    z = np.subtract(x, shift, out=weights, dtype=np.float64)
    if t != 1.0:
        z /= t
    return np.exp(z, out=z)


def min_p_keep(
    src: np.ndarray, floor: float, shift: float, ties: bool = False
) -> tuple[np.ndarray, np.ndarray, float, tuple[int, int] | None]:
    """The positions of float32 src whose float64 value is at least floor (a fresh array,
    in order), their float64 values minus shift (scratch memory), the sum of exp of those, and
    (the first position of the largest below the floor (-1: none, or -inf), the next of an equal
    value (-1: none), looked for where `ties`, else -2), the kernel's in the same pass
    (sampler_cuts.cut_below's answer: `at`); None without the kernel."""
    n = src.shape[0]
    z = scratch.get("f64a", n, np.float64)
    if kernel is not None:
        ids = scratch.get("ids", n, np.int64)
        k, mass, at, again = kernel.min_p(src, floor, shift, ids, z, ties)
        return ids[:k].astype(np.intp), z[:k], mass, (at, again)
    z[...] = src
    keep = np.greater_equal(z, floor, out=scratch.get("mask", n, np.bool_))
    kept = np.flatnonzero(keep)
    z = z[keep]
    z -= shift
    return kept, z, float(np.exp(z).sum()), None


def draw_walk(x: np.ndarray, shift: float, t: float, blocks: np.ndarray, block: int, u: float) -> int:
    """sampler_math.draw_unsorted's index in one kernel call (chain15): x the stored float64 weights, or
    the candidates' float32 logits whose block's weights are exp((x - shift) / t) as weights_of computes
    them. -1: not the kernel's to answer (no kernel, a NaN or a negative weight): draw_unsorted decides."""
    if kernel is None or not x.flags.c_contiguous or x.dtype not in (np.float32, np.float64):
        return -1
    return int(kernel.draw_walk(x, shift, t, blocks, block, u))


def count_greater(x: np.ndarray, i: int) -> int:
    """How many entries of x (float32 or float64) are greater than x[i]."""
    if kernel is not None:
        return int(kernel.count_greater(x, i))
    mask = scratch.get("mask", x.shape[0], np.bool_)
    return int(np.count_nonzero(np.greater(x, x[i], out=mask)))


def at_least(src: np.ndarray, threshold: np.floating) -> np.ndarray:
    """The positions of src at or above threshold (of src's type), in order (a fresh array):
    the kernel's pass for float32, numpy's for any."""
    if kernel is not None and src.dtype == np.float32:
        ids = scratch.get("ids", src.shape[0], np.int64)
        return ids[: kernel.at_least(src, float(threshold), ids)].astype(np.intp)
    return np.flatnonzero(np.greater_equal(src, threshold, out=scratch.get("mask", src.shape[0], np.bool_)))


#: above this k numpy's partition of the sample beats the kernel's heap (whose insertions
#: branch unpredictably): top-p's 257 of 1,536 sampled logits 0.016 ms against 0.055, of
#: 8,192 0.055 against 0.12; at 10-64 the heap is as fast or faster. Above it, of more than
#: _BINS_S sampled, the kernel's threshold from every eighth (sample_top_bins): Gemma's 257 of
#: ~8,000 26 us against numpy's 59 warm (of 1,536, numpy's 11 against its 13.5)
_HEAP_K = 64
_BINS_S = 4096


def sample_top(x: np.ndarray, stride: int, k: int) -> np.ndarray:
    """The k largest of the strided sample x[::stride] (k < its size), largest first (a fresh
    array of x's type): the values np.partition of the sample gives, found by the kernel's
    one pass over the sample (a heap of k) for float32 and k <= _HEAP_K, by numpy's partition
    otherwise, or the kernel's threshold from every eighth of a larger sample (_BINS_S)."""
    if kernel is not None and x.dtype == np.float32 and (k <= _HEAP_K or (x.shape[0] + stride - 1) // stride > _BINS_S):
        out = np.empty(k, dtype=np.float32)
        if kernel.sample_top(x, stride, out):
            return out
    sample = x[::stride]
    s = sample.shape[0]
    return np.sort(np.partition(sample, s - k)[s - k :])[::-1]


#: the kernel's top_k takes at most this many (its heap on the stack)
TOP_K_MAX = 256


def sort_down(work: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(ids in the order of np.argsort(-work[ids], kind="stable"), their logits as float64) in one
    call of the kernel; None (no kernel, other arrays): numpy's steps decide."""
    if kernel is None or work.dtype != np.float32 or ids.dtype != np.int64:
        return None
    if not (work.flags.c_contiguous and ids.flags.c_contiguous):
        return None
    out, logits64 = np.empty(ids.shape[0], dtype=np.int64), np.empty(ids.shape[0], dtype=np.float64)
    kernel.sort_down(work, ids, out, logits64)
    return out, logits64


def top_k(x: np.ndarray, k: int, mask: np.ndarray | None = None) -> np.ndarray | None:
    """The positions of the k largest of float32 x (among those `mask`, one bool a position,
    allows), largest first, in one pass of the kernel (a heap of k + 1), where that is numpy's one
    answer: no two of the k + 1 largest equal (sampler_math.top_indices' sampled threshold and
    argpartition order equal ones their own way), no NaN. None: numpy's way decides."""
    if kernel is None or x.dtype != np.float32 or not x.flags.c_contiguous or not 0 < k <= TOP_K_MAX:
        return None
    out = np.empty(k, dtype=np.intp)
    return out if kernel.top_k(x, None if mask is None else mask.view(np.uint8), out) else None


def bin_masses(
    x: np.ndarray, lo: np.float32, scale: np.float32, bins: int, q: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """top-p's bins (sampler_math.top_p_bins): each float32 logit's bin, (x - lo) * scale
    capped at bins - 1 and truncated, every step in float32 (scratch memory), and the sums
    of q (float64) by bin, added in order as np.bincount does."""
    n = x.shape[0]
    if kernel is not None:
        idx32 = scratch.get("bins32", n, np.int32)
        hist = np.empty(bins, dtype=np.float64)
        kernel.bin_masses(x, float(lo), float(scale), bins, q, idx32, hist)
        return idx32, hist
    vals = scratch.get("f32a", n, np.float32)
    np.subtract(x, lo, out=vals)
    np.multiply(vals, scale, out=vals)
    np.minimum(vals, np.float32(bins - 1), out=vals)
    idx = scratch.get("intp", n, np.intp)
    np.copyto(idx, vals, casting="unsafe")  # truncation, as astype(np.intp)
    return idx, np.bincount(idx, weights=q, minlength=bins)


def top_p_cut(
    x: np.ndarray, q: np.ndarray, target: float, bins: int, cut_out: list | None = None
) -> tuple[np.ndarray, float] | None:
    """sampler_math.top_p_bins in one call of the kernel (its steps one for one: the same
    positions in the same order, the same mass): (the kept positions, scratch memory until the
    next call: not copied, ~0.06 ms on Gemma's flat rows; their mass), or None where numpy's steps must run (no kernel; a non-finite logit, a single
    value, a spread too narrow for float32's scale). `cut_out`: the most likely position not kept is
    appended where the cut-off's bin holds one (the largest logit not kept, the first of equal ones),
    else -1; nothing where every position was kept."""
    n = x.shape[0]
    if kernel is None or n == 0 or x.dtype != np.float32 or q.dtype != np.float64:
        return None
    kept = scratch.get("ids2", n, np.int64)
    k, mass = kernel.top_p_cut(x, np.ascontiguousarray(q), target, bins, scratch.get("bins32", n, np.int32), kept)
    if k < 0:
        return None
    if cut_out is not None and k < n:
        cut_out.append(int(kept[k]))
    return kept[:k].astype(np.intp, copy=False), float(mass)


#: top_p_deep's answers, by the kernel's code (0: none)
_TOP_P_HOW = ("", "first", "rest", "deep", "all", "head")
#: its six scratch arrays' types: ids, qd, xd, idx, kept, kabs
_TOP_P_TYPES = (np.int64, np.float64, np.float32, np.int32, np.int64, np.int64)


def top_p_deep(
    src: np.ndarray,
    shift: float,
    top_p: float,
    full: np.ndarray,
    stored: bool,
    want: int = 0,
    sample: np.ndarray | None = None,
) -> tuple | None:
    """sampler_math's _deep_sample and _top_p_deep up to the bins, in one call of the kernel (their steps
    one for one, each float64 sum in their order): None where their own steps decide (no kernel, no deep
    set, a NaN sampled); else (how: "first", the most likely alone; "rest", the deep set made, the head's
    cut or numpy's bins left to the caller; "head", the head's cut; "deep" or "all", the bins inside the
    deep set or over every position; the total; the kept mass; the kept positions of src; the same as positions in the deep set
    ("head", "deep"); the most likely position cut, -1 where the cut bin was kept whole, -2 where every position
    was; (the deep set's positions, logits and masses, the head's threshold); top_indices(src[kept], want)
    where the search found it among the deep set, else None), arrays in scratch memory. `full`, `stored`:
    exp_sum_above's. `want`: the reported top's size (0: none). `sample`: src[::32], read instead of src's
    strided values (the constraint's scan wrote it)."""
    n = src.shape[0]
    if kernel is None or src.dtype != np.float32 or not src.flags.c_contiguous:
        return None
    ids, qd, xd, idx, kept, kabs = scratch.group("top_p_deep", n, _TOP_P_TYPES)
    top = np.empty(want if 0 < want <= TOP_K_MAX else 0, dtype=np.int64)
    code, total, nd, k, mass, cut, a_head, n_top = kernel.top_p_deep(
        src, shift, top_p, full, stored, ids, qd, xd, idx, kept, kabs, 2048, top, sample
    )
    if code == 0:
        return None
    deep = (ids[:nd], xd[:nd], qd[:nd], np.float32(a_head))
    return _TOP_P_HOW[code], total, mass, kabs[:k], kept[:k], cut, deep, top if n_top else None


def bin_split(idx: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The positions of idx above b and at b, each in order (fresh arrays)."""
    n = idx.shape[0]
    if kernel is not None and idx.dtype == np.int32:
        above, inside = scratch.get("ids", n, np.int64), scratch.get("ids2", n, np.int64)
        n_above, n_inside = kernel.bin_split(idx, b, above, inside)
        return above[:n_above].astype(np.intp), inside[:n_inside].astype(np.intp)
    mask = scratch.get("mask", n, np.bool_)
    inside = np.flatnonzero(np.equal(idx, b, out=mask))
    return np.flatnonzero(np.greater(idx, b, out=mask)), inside


def take(kept: np.ndarray, cand: np.ndarray | None, src: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, int]:
    """Top-p's kept positions into its source `src` (float32: the candidates' logits, in the order of
    `cand`; cand None: the whole vocabulary) as the new candidates: (their ids, cand[kept] or kept;
    their logits, src[kept]; the least of those; how many equal it). The kernel's one loop writes
    the ids and logits into scratch memory (as the constraint's candidates: kept until the next
    step), numpy's gathers into fresh arrays; the same numbers (NaN logits aside)."""
    k = kept.shape[0]
    if kernel is not None and src.dtype == np.float32 and (cand is None or cand.dtype == np.int64):
        ids, out = scratch.get("take_ids", k, np.int64), scratch.get("take_src", k, np.float32)
        low, n_low = kernel.take(kept.astype(np.int64, copy=False), cand, src, ids, out)
        return ids, out, float(low), int(n_low)
    ids = kept.copy() if cand is None else cand[kept]
    out = src[kept]
    low = float(out.min()) if k else float("inf")
    return ids, out, low, int(np.count_nonzero(out == np.float32(low)))
