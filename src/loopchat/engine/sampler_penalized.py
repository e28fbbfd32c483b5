"""The penalties' change to the logits the sampler's stages read (Candidates.change_logits in
sampler_stages): a few tokens get new logits, on a copy of the model's, and the chain's mass
unit, its bound on the exact total (sampler_raw's) and its known maximum move with them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from loopchat.engine import sampler_fused
from loopchat.engine.sampler_scratch import scratch


class Penalized(Protocol):
    """What change_logits reads and moves of the candidates (sampler_stages.Candidates)."""

    logits: np.ndarray
    work: np.ndarray
    n_vocab: int
    raw_max: float
    norm: float
    work_max: float | None
    work_max_id: int
    bound: tuple[float, float] | None


def recent_ids(context: Sequence[int], last_n: int, n_vocab: int) -> np.ndarray:
    """The repeat penalty's tokens: the distinct ids of the context's last `last_n` tokens within the
    vocabulary, in the order each first comes (int64). One kernel call over the History's int64 tail
    (dry.History) where both are there; else Python's dict keeps that order."""
    n = min(last_n, len(context))
    tail = getattr(context, "tail", None)
    kernel = sampler_fused.kernel
    if tail is not None and kernel is not None and n > 0:
        window = tail(n)
        out = np.empty(n, dtype=np.int64)
        return out[: kernel.recent_ids(window, n_vocab, out)]
    window = context[len(context) - n :] if n > 0 else []
    firsts = dict.fromkeys(t for t in window if 0 <= t < n_vocab)
    return np.fromiter(firsts, dtype=np.int64, count=len(firsts))


def change_logits(c: Penalized, ids: np.ndarray, values: np.ndarray | None, penalty: float = 0.0) -> tuple[int, float]:
    """Give the tokens `ids` (distinct) new logits, on a copy of the model's, and move the mass
    unit with them (before any stage has narrowed the candidates). Returns how many logits
    changed and the mass moved: the total variation distance between the softmax before and
    after (the other tokens all scale by the same factor). One call of the kernel (its
    change_logits: the same steps in C, libm's exp) or numpy's. `values` None: the repeat
    penalty's, each logit v divided by `penalty` where v > 0, else multiplied (in float32, as
    numpy's np.where of the two; made in the same kernel call)."""
    kernel = sampler_fused.kernel
    # (Candidates keep the ids changed: sampler_rawtop reads that every other logit is the model's)
    changed = getattr(c, "changed_ids", None)
    if changed is not None:
        changed.append(ids)
    copy = c.work is c.logits
    prefilled = getattr(c, "work_copy", None)  # (the raw pass copied them already: sampler_raw's `copy`)
    if copy and prefilled is not None:
        c.work, copy = prefilled, False
    elif copy:
        c.work = scratch.get("work", c.n_vocab, np.float32)
    if kernel is not None and ids.dtype == np.int64 and c.logits.dtype == np.float32 and c.logits.flags.c_contiguous:
        watch = c.work_max_id if c.work_max is not None else -1
        vals = None if values is None else np.ascontiguousarray(values)
        norm, moved, changed, before_sum, after_sum, top, at, watched = kernel.change_logits(
            c.logits, c.work, ids, vals, c.raw_max, c.norm, copy, watch, penalty
        )
        c.norm = norm
        top_id = int(ids[at]) if at >= 0 else -1
    else:
        if values is None:  # (the repeat penalty's: before the copy, the logits are the work's)
            v = c.work[ids] if not copy else c.logits[ids]
            values = np.where(v > 0, v / penalty, v * penalty)
        moved, changed, before_sum, after_sum, top, top_id, watched = _numpy_change(c, ids, values, copy)
    if c.bound is not None:  # (the changed exps are float64's: the sum moved within 1e-12 of them)
        c.bound = (c.bound[0] + (after_sum - before_sum), c.bound[1] + 1e-12 * (after_sum + before_sum))
    if c.work_max is not None:
        if watched:
            c.work_max = None  # the token that held it changed: not known
        elif top_id >= 0 and top > c.work_max:
            c.work_max, c.work_max_id = top, top_id
    return changed, 0.5 * moved if changed else 0.0


def _numpy_change(
    c: Penalized, ids: np.ndarray, values: np.ndarray, copy: bool
) -> tuple[float, int, float, float, float, int, bool]:
    """change_logits' steps in numpy: (moved, changed, the two sums, the largest new logit and
    its token (-1: none), whether the known maximum's token is among ids)."""
    if copy:
        np.copyto(c.work, c.logits)
    old = c.work[ids]
    before = np.exp(old.astype(np.float64) - c.raw_max)
    c.work[ids] = values
    stored = c.work[ids]
    after = np.exp(stored.astype(np.float64) - c.raw_max)
    norm0, before_sum, after_sum = c.norm, float(before.sum()), float(after.sum())
    c.norm += after_sum - before_sum
    rest = max(norm0 - before_sum, 0.0)
    moved = float(np.abs(after / c.norm - before / norm0).sum()) + abs(rest / norm0 - rest / c.norm)
    changed = int(np.count_nonzero(stored != old))
    watched = c.work_max is not None and bool(np.any(ids == c.work_max_id))
    at = int(np.argmax(stored)) if stored.shape[0] else -1
    top = float(stored.max()) if at >= 0 else 0.0
    return moved, changed, before_sum, after_sum, top, int(ids[at]) if at >= 0 else -1, watched
