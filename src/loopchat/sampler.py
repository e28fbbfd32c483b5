"""The sampling chain, in numpy, instrumented.

Order (the same as llama.cpp's common sampler chain): repeat penalty -> top-k -> top-p
-> min-p -> temperature -> draw. Top-p sees the softmax of the candidates left by
top-k, min-p keeps tokens whose logit is at least max + ln(min_p) (p >= min_p * p_max),
temperature divides the surviving logits, and the draw uses numpy's PCG64 seeded from
the settings. Temperature 0 is greedy: the distribution sampled from is then a single
token with probability 1.

Everything a step reports is computed here from the model's logits: the raw softmax
(and its entropy) over the whole vocabulary, the distribution actually sampled from,
and the chosen token's probability and rank in both. It is written to cost a small
fraction of a forward pass whatever the settings: the exact top-K selection avoids a
full sort, and with top-k off (or very large) the candidates are never sorted whole.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
            cand = np.flatnonzero(x >= threshold)
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


def _top_p_set(work: np.ndarray, cand: np.ndarray, top_p: float, bins: int = 2048) -> np.ndarray:
    """The top-p candidates of `cand` (unsorted): what a sort by logit, largest first,
    keeps up to and including the token at which the softmax mass reaches top_p, found
    without sorting them all. The logits go into bins of equal width (a bin index is
    monotone in the logit, so a higher bin holds only larger logits); the bins' masses,
    summed from the top, point to the bin where top_p is reached; every token above it
    is kept, and only the tokens of that bin are sorted."""
    vals = work[cand].astype(np.float64)
    mx, lo = float(vals.max()), float(vals.min())
    q = np.exp(vals - mx)
    target = top_p * float(q.sum())
    if mx > lo:
        idx = ((vals - lo) * (bins / (mx - lo))).astype(np.intp)
        np.minimum(idx, bins - 1, out=idx)
    else:
        idx = np.zeros(vals.shape[0], dtype=np.intp)
    from_top = np.cumsum(np.bincount(idx, weights=q, minlength=bins)[::-1])
    b = bins - 1 - min(int(np.searchsorted(from_top, target, side="left")), bins - 1)
    mass_above = float(from_top[bins - 2 - b]) if b < bins - 1 else 0.0
    inside = np.flatnonzero(idx == b)
    order = inside[np.argsort(-vals[inside], kind="stable")]
    cum = mass_above + np.cumsum(q[order])
    n_keep = min(int(np.searchsorted(cum, target, side="left")) + 1, order.shape[0])
    return cand[np.concatenate([np.flatnonzero(idx > b), order[:n_keep]])]


def _unsorted_distribution(
    work: np.ndarray, cand: np.ndarray, settings: SamplingSettings
) -> tuple[np.ndarray, np.ndarray, float]:
    """The rest of the chain for more than SORT_LIMIT candidates (top-k and top-p done):
    (candidates, their probabilities, entropy in bits). Min-p is a threshold and
    temperature a scale, neither needs an order: the candidates stay in the order they
    come (the same for the same logits and settings, so a seed still draws the same
    tokens)."""
    cand_logits = work[cand].astype(np.float64)
    mx = float(cand_logits.max())
    if settings.min_p > 0.0:
        keep = cand_logits >= mx + math.log(settings.min_p)
        cand, cand_logits = cand[keep], cand_logits[keep]
    z = (cand_logits - mx) / settings.temperature
    probs = np.exp(z)
    norm = float(probs.sum())
    probs /= norm
    # entropy in nats is ln(norm) - sum(p z): no logarithm per candidate
    # (a plain sum: np.dot would call BLAS, whose threads spin against llama.cpp's)
    entropy = (math.log(norm) - float((probs * z).sum())) * _LOG2E if cand.shape[0] > 1 else 0.0
    return cand, probs, max(entropy, 0.0)


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
) -> SampleResult:
    """Run the chain on one row of logits (float32, n_vocab) and report everything."""
    n_vocab = logits.shape[0]

    # --- raw softmax over the whole vocabulary ---------------------------------
    raw_max = float(logits.max())
    shifted = logits - np.float32(raw_max)
    e = np.exp(shifted)
    total = float(e.sum())
    raw_entropy = (math.log(total) - float(np.dot(e, shifted)) / total) * _LOG2E

    raw_top_ids = top_indices(logits, report_k)

    # --- repeat penalty (on a copy: the raw distribution stays raw) -------------
    work = logits
    if settings.repeat_penalty != 1.0 and settings.repeat_last_n > 0 and recent_tokens:
        recent = {t for t in recent_tokens[-settings.repeat_last_n :] if 0 <= t < n_vocab}
        if recent:
            ids = np.fromiter(recent, dtype=np.intp, count=len(recent))
            work = logits.copy()
            v = work[ids]
            work[ids] = np.where(v > 0, v / settings.repeat_penalty, v * settings.repeat_penalty)

    # --- top-k: candidates sorted by (penalized) logit, largest first -----------
    # (a large candidate set is never sorted whole: see _top_p_set, _unsorted_distribution)
    k = 1 if settings.greedy else settings.top_k
    if k <= 0 or k > n_vocab:
        k = n_vocab  # top-k off
    raw_top_probs = e[raw_top_ids].astype(np.float64) / total
    top_p_done = False
    unsorted = False
    if k > SORT_LIMIT and not settings.greedy:
        cand = _top_set(work, k)
        if settings.top_p < 1.0:
            cand = _top_p_set(work, cand, settings.top_p)
        if cand.shape[0] > SORT_LIMIT:
            unsorted = True
        else:
            cand = cand[np.argsort(-work[cand], kind="stable")]  # few left: the sorted path
            top_p_done = True
    elif work is logits and k <= report_k:
        cand = raw_top_ids[:k]
    else:
        cand = top_indices(work, k)

    if unsorted:
        kept_ids, probs, sampled_entropy = _unsorted_distribution(work, cand, settings)
        top = top_indices(probs, report_k)  # only the reported candidates are sorted
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
    if kept_ids.shape[0] == 1:
        pick = 0
    else:
        u = rng.random()
        pick = int(np.searchsorted(np.cumsum(probs), u, side="right"))
        pick = min(pick, kept_ids.shape[0] - 1)
    token_id = int(kept_ids[pick])

    chosen_logit = logits[token_id]
    raw_rank = int(np.count_nonzero(logits > chosen_logit)) + 1
    sampled_rank = int(np.count_nonzero(probs > probs[pick])) + 1
    return SampleResult(
        token_id=token_id,
        raw_top_ids=raw_top_ids,
        raw_top_probs=raw_top_probs,
        sampled_top_ids=kept_ids[top],
        sampled_top_probs=probs[top],
        raw_prob=float(math.exp(float(chosen_logit) - raw_max) / total),
        raw_rank=raw_rank,
        sampled_prob=float(probs[pick]),
        sampled_rank=sampled_rank,
        raw_entropy=float(raw_entropy),
        sampled_entropy=sampled_entropy,
        kept=int(kept_ids.shape[0]),
    )
