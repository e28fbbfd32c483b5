"""The most likely token a stage removed, where the stage's own selection does not hand it
over (the unsorted form, sampler_stages): with the C kernel, one read-only pass for the
largest logit below the last kept one and a search for its first position (`cut_after`,
`cut_below`); else one copy of the logits and one argmax (`first_cut`).

The token is the largest logit among those that entered the stage and did not leave it;
equal ones: the lowest id (argmax's first), the token a stable sort by logit would have
cut first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loopchat.engine import sampler_fused
from loopchat.engine.sampler_math import top_indices
from loopchat.engine.sampler_scratch import scratch


def first_cut(work: np.ndarray, entered: np.ndarray | None, kept: np.ndarray) -> int:
    """The id of the largest logit of `work` among `entered` (vocabulary ids; None: every
    token) and not in `kept` (ids); -1 when every one was kept."""
    n = work.shape[0]
    if (n if entered is None else entered.shape[0]) <= kept.shape[0]:
        return -1
    tmp = scratch.get("cut", n, np.float32)
    if entered is None:
        np.copyto(tmp, work)
    else:
        tmp.fill(-np.inf)
        tmp[entered] = work[entered]
    tmp[kept] = -np.inf
    i = int(np.argmax(tmp))
    return -1 if tmp[i] == -np.inf else i  # (-1 too when the removed tokens' logits were all -inf)


def cut_of_top(top: np.ndarray, k: int) -> int:
    """The first token a sorted top-`k` cut: top[k] (`top` holds at least k + 1, largest
    first), or -1 when `top` holds only k."""
    return int(top[k]) if top.shape[0] > k else -1


def cut_after(
    work: np.ndarray,
    entered: np.ndarray | None,
    kept: np.ndarray,
    mask: np.ndarray | None = None,
    least: tuple[float, int] | None = None,
    mask_n: int = -1,
) -> int:
    """first_cut, where `kept` holds every entered token above its least logit (top-k's and
    top-p's sets). With the kernel, no copy of the vocabulary: the largest logit below the
    least kept one (its lowest id), in one read-only pass that also counts the ties of the
    least kept; where one of those was not kept (equal logits: rare), first_cut. Entered
    tokens (not None): only where `mask` (one bool a token: the constraint's) allows them
    and no other, the pass skipping the tokens it forbids. `least`: the least kept logit and how
    many kept ones equal it, where the caller has them (sampler_fused.take), else found here. `mask_n`:
    how many tokens `mask` allows, where the caller knows it (-1: counted here)."""
    kernel = sampler_fused.kernel
    n = work.shape[0] if entered is None else entered.shape[0]
    if kernel is None or not 0 < kept.shape[0] < n:
        return first_cut(work, entered, kept)
    if entered is not None and (mask is None or (np.count_nonzero(mask) if mask_n < 0 else mask_n) != n):
        # (entered: a subset of the tokens the mask allows)
        return first_cut(work, entered, kept)
    cut = _cut_below(kernel, work, kept, mask, least)
    return first_cut(work, entered, kept) if cut is None else cut


def _cut_below(
    kernel: Any, work: np.ndarray, kept: np.ndarray, mask: np.ndarray | None, least: tuple[float, int] | None
) -> int | None:
    """The kernel's pass of cut_after: the largest logit below the least kept one (among those
    `mask` allows), or None where a token not kept ties the least kept logit (rare: first_cut's
    way). `least`: (the least kept logit, how many kept ones equal it), or None: found here."""
    if least is None:
        v = work[kept]
        low = float(v.min())
        least = low, int(np.count_nonzero(v == low))
    low = least[0]
    i, n_eq = kernel.cut_below(work, low) if mask is None else kernel.cut_below_mask(work, low, mask.view(np.uint8))
    return None if n_eq > least[1] else int(i)


def cut_after_mask(work: np.ndarray, kept: np.ndarray, mask: np.ndarray) -> int:
    """cut_after for the entered tokens every token `mask` allows (one bool a token), where their
    ids were never made (a constraint's before top-k: Candidates.defer_ids): made only where a
    token not kept ties the least kept logit (first_cut's way)."""
    kernel = sampler_fused.kernel
    if kernel is None or kept.shape[0] == 0:
        return cut_after(work, np.flatnonzero(mask), kept, mask)
    cut = _cut_below(kernel, work, kept, mask, None)
    return first_cut(work, np.flatnonzero(mask), kept) if cut is None else cut


def cut_among(work: np.ndarray, deep: np.ndarray, kept: np.ndarray) -> int:
    """cut_after over the whole vocabulary, for top-p's kept ids inside its deep set `deep` (the
    positions, in order, of every logit at or above a threshold the kept ones reach): the most
    likely token cut is the deep set's most likely one not kept, found among its logits alone
    (its lowest position is its lowest id); where every token of the deep set was kept, by
    cut_after's pass."""
    if not 0 < kept.shape[0] < deep.shape[0]:
        return cut_after(work, None, kept)
    at = np.searchsorted(deep, kept)  # (kept, as positions in the deep set)
    i = cut_after(work[deep], None, at)
    return int(deep[i]) if i >= 0 else -1


def cut_below(
    work: np.ndarray,
    entered: np.ndarray | None,
    kept: np.ndarray,
    src: np.ndarray,
    floor: float,
    ascending: bool = False,
    at: tuple[int, int] | None = None,
) -> int:
    """first_cut, where `kept` are the entered tokens whose float64 logit is at least `floor`
    (min-p; `src`: the entered tokens' logits, in the order of `entered`): the largest logit
    below the floor, its lowest id. With the kernel: a read-only pass over `src`, or `at`, its
    answer where the kernel's min-p pass found it (sampler_fused.min_p_keep: the first position
    and the next of an equal logit, -1 none, -2 not looked for). `ascending`: `entered` is in id
    order (the constraint's ids), so that the kernel's first position of the largest is the lowest
    id of equal ones; so is it where no other position holds that logit. Else a pass over `src` for them."""
    kernel = sampler_fused.kernel
    if kernel is None or kept.shape[0] >= src.shape[0]:
        return first_cut(work, entered, kept)
    if at is None:
        v = np.float32(floor)  # the least float32 at or above the floor: x < v exactly where float64(x) < floor
        if float(v) < floor:
            v = np.nextafter(v, np.float32(np.inf))
        at = int(kernel.cut_below(src, float(v))[0]), -2
    i = at[0]
    if i < 0 or entered is None:
        return i
    if ascending or at[1] == -1:
        return int(entered[i])
    return int(entered[src == src[i]].min())  # (equal logits: the lowest id, whatever the order of `entered`)


def top_and_cut(work: np.ndarray, k: int, raw_top: np.ndarray | None) -> tuple[np.ndarray, int]:
    """Top-k's sorted candidates and its cut token: the k largest of `work` as
    sampler_math.top_indices(work, k) gives them (`raw_top`: the raw top ids, the model's
    logits unchanged, when they hold k: their first k), and the most likely token cut. One
    search for k + 1 where its values are distinct (the k largest and their order are then
    unique: the same ids); where ties hold some, the same search as the reference's, for k
    (equal logits' order is the search's), and the token after them (cut_after)."""
    if raw_top is not None and raw_top.shape[0] > k:
        return raw_top[:k], int(raw_top[k])
    top = top_indices(work, k + 1)
    if top.shape[0] <= k:  # (the whole vocabulary)
        return top, -1
    v = work[top]
    if bool(np.all(v[:-1] > v[1:])):
        return top[:k], int(top[k])
    ids = raw_top[:k] if raw_top is not None else top_indices(work, k)
    return ids, cut_after(work, None, ids)
