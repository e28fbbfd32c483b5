"""The sampling chain, in numpy, instrumented.

Order (the same as llama.cpp's common sampler chain): repeat penalty (-> frequency and
presence penalties, llama.cpp's same sampler) -> DRY (dry.py) -> top-k -> top-p -> min-p ->
temperature -> draw. The stages are objects (sampler_stages: `chain_for`
builds a step's chain from the settings), each narrowing the candidates and reporting
what it removed; their numeric pieces are in sampler_math. Top-p sees the softmax of the
candidates left by top-k, min-p keeps tokens whose logit is at least max + ln(min_p)
(p >= min_p * p_max), temperature divides the surviving logits, and the draw uses
numpy's PCG64 seeded from the settings. Temperature 0 is greedy: the distribution
sampled from is then a single token with probability 1.

Everything a step reports is computed here from the model's logits: the raw softmax
(and its entropy) over the whole vocabulary, the distribution actually sampled from,
the chosen token's probability and rank in both, and each stage's report. It is written
to cost a small fraction of a forward pass whatever the settings: the exact top-K
selection avoids a full sort, with top-k off (or very large) the candidates are never
sorted whole, and the arrays of the vocabulary's size are scratch memory kept from step
to step (on Gemma 3's 262,144 tokens fresh ones cost more than the arithmetic: see
sampler_scratch). The float64 passes over the vocabulary are one call each of
sampler_fused: the optional C kernel (_sampler_kernel.c) or numpy, the same numbers; the
raw softmax's float32 passes one call of sampler_raw (the kernel's fused pass, numpy's bits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loopchat.engine import sampler_fused, sampler_ranks, sampler_rawtop, sampler_tail
from loopchat.engine.sampler_distribution import LOG2E, Distribution, sorted_distribution, unsorted_distribution
from loopchat.engine.sampler_math import DRAW_BLOCK, SORT_LIMIT, draw_unsorted, top_indices
from loopchat.engine.sampler_plan import from_context, plan_of
from loopchat.engine.sampler_raw import RawSoftmax, raw_softmax
from loopchat.engine.sampler_scratch import scratch
from loopchat.engine.sampler_stages import Candidates, Stage, StageReport, chain_for
from loopchat.settings import SamplingSettings

__all__ = ["SampleResult", "StageReport", "chain_for", "entropy_bits", "make_rng", "sample", "top_indices"]


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
    stages: tuple[StageReport, ...] = ()  # what each stage of the chain did, in order
    #: what the figures of other tokens are read from, until the next draw (sampler_watch.py):
    #: (the logits, the raw pass, its total, the distribution drawn from (or sampler_tail's draw: its
    #: ids and TailDraw, sampler_watch.distribution_of), the top's weights)
    basis: tuple | None = None


def _wide_top(
    logits: np.ndarray, settings: SamplingSettings, report_k: int, constraint: Stage | None
) -> np.ndarray | None:
    """Where top-k will read the model's logits unchanged (no penalty, DRY, bias or constraint
    before it) and keep k <= SORT_LIMIT of them, more than the report asks for: the k + 1 largest,
    largest first, in the kernel's one pass where they are distinct and there is no NaN. They are
    then top_indices(logits, k + 1), which top-k takes (Candidates.take_top), and their first
    report_k are top_indices(logits, report_k), the raw top: one pass for both, and the first is
    the max (the pass logits.max() took is saved). None: not so; each is searched as before."""
    k = settings.top_k
    if (
        constraint is not None
        or settings.greedy
        or not report_k <= k <= SORT_LIMIT
        or k >= logits.shape[0]
        or settings.logit_bias
        or from_context(settings)
    ):
        return None
    return sampler_fused.top_k(logits, k + 1)


def _draw(d: Distribution, rng: np.random.Generator, force: int | None) -> tuple[int, int | None]:
    """(the token, its position in d; None: a forced token the filters cut)."""
    n_kept = d.n
    if force is not None:
        return int(force), d.position(int(force))
    if n_kept == 1:
        pick = 0
    elif d.blocks is not None:  # (the kernel's walk, else numpy's: the same index)
        u, x = rng.random() * d.norm, d.probs if d.probs is not None else d.source
        pick = -1 if x is None else sampler_fused.draw_walk(x, d.shift, d.t, d.blocks, DRAW_BLOCK, u)
        pick = draw_unsorted(d.probs, u, d.blocks, d.block) if pick < 0 else pick
    else:
        assert d.probs is not None
        u = rng.random()
        pick = min(int(np.searchsorted(np.cumsum(d.probs), u, side="right")), n_kept - 1)
    return (pick if d.ids is None else int(d.ids[pick])), pick


def rank_of(x: np.ndarray, i: int, top: np.ndarray, at: int | None = None) -> int:
    """1 + how many entries of x are larger than x[i]. `top`: the positions of x's largest
    entries, largest first (exact: nothing outside them is larger than the last). If i is
    among them, only those before it can be larger: a pass over x saved. `at`: i's place in
    `top` (-1: not there) where the caller knows it; None: looked for."""
    if at is None:
        where = np.flatnonzero(top == i)
        at = int(where[0]) if where.size else -1
    if at >= 0:
        return int(np.count_nonzero(x[top[:at]] > x[i])) + 1
    return sampler_fused.count_greater(x, i) + 1


def _sampled_rank(d: Distribution, pick: int, pick_weight: float, top_weights: np.ndarray) -> int:
    """The drawn token's rank in the distribution sampled from: among the reported top if
    it is there, else a count over the weights. Weights not stored (every token kept,
    penalized logits): the count is over the float32 logits they came from, the same
    order: two different float32 logits x, y (|x| >= 1e-3) differ by at least 1.2e-10
    relatively, their weights exp((x - shift) / t) by far more than the kernel's 2-ulp
    exp error, and none underflows above z = -700. Outside that, the weights are
    computed whole."""
    where = np.flatnonzero(d.top == pick)
    if where.size:
        return int(np.count_nonzero(top_weights[: int(where[0])] > pick_weight)) + 1
    if d.probs is not None:
        return sampler_fused.count_greater(d.probs, pick) + 1
    assert d.source is not None
    x = float(d.source[pick])
    if sampler_ranks.logits_order(x, d.shift, d.t):
        return sampler_fused.count_greater(d.source, pick) + 1
    d.probs = sampler_fused.distribution(d.source, d.shift, d.t, DRAW_BLOCK)[0]
    return sampler_fused.count_greater(d.probs, pick) + 1


def _chain_of(settings: SamplingSettings, constraint: Stage | None) -> tuple[Stage, ...]:
    """chain_for(settings), with the constraint's stage in its place (with_constraint): the plan's
    (sampler_plan: the last step's where the settings and the constraint are the same objects)."""
    return plan_of(settings, constraint).chain


def entropy_bits(logits: np.ndarray) -> float:
    """Entropy in bits of softmax(logits), computed stably in float64."""
    z = logits.astype(np.float64, copy=False)
    z = z - z.max()
    e = np.exp(z)
    total = e.sum()
    return float((math.log(total) - float(np.dot(e, z)) / total) * LOG2E)


def make_rng(seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))


def sample(
    logits: np.ndarray,
    recent_tokens: Sequence[int],
    settings: SamplingSettings,
    rng: np.random.Generator,
    report_k: int = 10,
    force: int | None = None,
    constraint: Stage | None = None,
) -> SampleResult:
    """Run the chain on one row of logits (float32, n_vocab) and report everything.

    `force`: the token is this one (picked by hand in step mode), not drawn: `rng` is
    not used, and the token's probabilities and ranks are reported as for a drawn one
    (a token the filters cut has sampled_prob 0 and sampled_rank 0). `constraint`: the
    reply's grammar stage (sampler_constraint), run after the penalties, before top-k."""
    sampler_fused.chain_starts()  # (the kernel's helper thread awake before the first long pass)
    try:
        return _sample(logits, recent_tokens, settings, rng, report_k, force, constraint)
    finally:
        sampler_fused.chain_ends()


def _sample(
    logits: np.ndarray,
    recent_tokens: Sequence[int],
    settings: SamplingSettings,
    rng: np.random.Generator,
    report_k: int,
    force: int | None,
    constraint: Stage | None,
) -> SampleResult:
    """sample()'s chain."""
    plan = plan_of(settings, constraint)
    n_vocab = logits.shape[0]
    narrows = 0 < plan.top_k < n_vocab  # (top-k keeps fewer than the whole vocabulary)
    # --- raw softmax over the whole vocabulary ---------------------------------
    # (the raw top first: where the kernel's one pass finds it (no tie, no NaN) its first is the
    # max, and numpy's pass for it is saved; else top_indices as before. Where top-k will read the
    # logits unchanged, the one pass finds its k + 1 too: _wide_top)
    wide = _wide_top(logits, settings, report_k, constraint) if report_k <= plan.wide_k < n_vocab else None
    raw_wide = None  # (the wider raw top sampler_rawtop reads, where a constraint's allowed are all kept)
    if wide is not None:
        raw_top_ids: np.ndarray | None = wide[:report_k]
        raw_max = float(logits[wide[0]])
    else:
        raw_top_ids, raw_wide = sampler_rawtop.raw_top(logits, report_k, plan.keeps_all and not narrows)
        raw_max = float(logits.max()) if raw_top_ids is None else float(logits[raw_top_ids[0]])
    # (sampler_raw: one fused pass or numpy's, the same bits; the float64 sum where top-p may
    # run over the whole vocabulary: its bound, sampler_math.top_p_bounded. The logits copied in
    # the same pass where a penalty may change some: sampler_penalized's copy)
    whole_top_p = constraint is None and plan.top_p_open and not narrows
    penalize = plan.penalize == 2 or (plan.penalize == 1 and len(recent_tokens) > 0)
    copy = scratch.get("work", n_vocab, np.float32) if penalize else None
    raw = raw_softmax(logits, raw_max, whole_top_p, copy)
    total = raw.total
    raw_entropy = (math.log(total) - raw.dot / total) * LOG2E
    if raw_top_ids is None:
        raw_top_ids = top_indices(logits, report_k)
    raw_top_probs = raw.probs_at(raw_top_ids)

    # --- the stages, then the distribution sampled from, then the draw ----------
    c = Candidates(logits, recent_tokens, raw_max, total, raw_top_ids, report_k, raw.bound())
    c.work_copy = raw.copied
    c.wide_top, c.raw_wide = wide, raw_wide
    c.narrow_k = plan.narrow_k  # (right after the constraint: chain_for's order)
    c.exps_wanted = plan.top_p_open and not narrows
    chain = plan.chain
    at = plan.tail_at if force is None else len(chain)
    reports = [stage.apply(c) for stage in chain[:at]]
    tail = sampler_tail.draw_sorted(c, chain[at:], rng) if at < len(chain) else None
    if tail is None and at < len(chain) and not c.sorted:
        # (top-p over the unsorted candidates, as a stage: where it sorted the few it kept, the rest in floats)
        reports.append(chain[at].apply(c))
        at += 1
        tail = sampler_tail.draw_sorted(c, chain[at:], rng) if c.count <= sampler_tail.AFTER_TOP_P else None
    if tail is None:
        return _staged(logits, raw, raw_top_ids, raw_top_probs, raw_entropy, wide, c, chain[at:], reports, rng, force)
    # (sampler_tail's draw: the distribution in Python floats, normalised; the reported top its first)
    assert c.ids is not None
    pick, probs = tail.pick, tail.probs
    token_id = int(c.ids[pick])
    raw_rank, raw_prob = _raw_figures(logits, raw, raw_top_ids, raw_top_probs, token_id, wide)
    m = min(report_k, len(probs))
    top_weights = np.array(probs[:m], dtype=np.float64)
    return SampleResult(
        token_id=token_id,
        raw_top_ids=raw_top_ids,
        raw_top_probs=raw_top_probs,
        sampled_top_ids=c.ids[:m].copy(),
        sampled_top_probs=top_weights,
        raw_prob=raw_prob,
        raw_rank=raw_rank,
        sampled_prob=float(probs[pick]),
        sampled_rank=tail.rank,
        raw_entropy=float(raw_entropy),
        sampled_entropy=tail.entropy,
        kept=len(probs),
        stages=(*reports, *tail.reports),
        basis=(logits, raw, total, (c.ids, tail), top_weights),
    )


def _staged(
    logits: np.ndarray,
    raw: RawSoftmax,
    raw_top_ids: np.ndarray,
    raw_top_probs: np.ndarray,
    raw_entropy: float,
    wide: np.ndarray | None,
    c: Candidates,
    rest: tuple[Stage, ...],
    reports: list[StageReport],
    rng: np.random.Generator,
    force: int | None,
) -> SampleResult:
    """_sample's end where the chain's last stages run as stages (sampler_tail declined, a token is
    forced, or the chain does not end with its stages): the distribution, the draw, the figures."""
    reports += [stage.apply(c) for stage in rest]
    d = sorted_distribution(c) if c.sorted else unsorted_distribution(c)
    token_id, pick = _draw(d, rng, force)
    # (both ranks counted in one pass where a constraint's mask allows: sampler_ranks)
    both = None if pick is None else sampler_ranks.both_ranks(c, d, token_id, pick, raw_top_ids)
    raw_rank, raw_prob = _raw_figures(logits, raw, raw_top_ids, raw_top_probs, token_id, wide, both)
    top_weights = d.weights(d.top)
    pick_weight = 0.0 if pick is None else float(d.weights(slice(pick, pick + 1))[0])  # (a view: no gather)
    if pick is None or both is not None:
        sampled_rank = 0 if both is None else both[1]
    elif d.ids is None and c.work is logits:
        # every token kept, no penalty: the probabilities rise with the raw logits, so
        # the ranks are the same (a pass over the vocabulary saved)
        sampled_rank = raw_rank
    else:
        sampled_rank = _sampled_rank(d, pick, pick_weight, top_weights)
    return SampleResult(
        token_id=token_id,
        raw_top_ids=raw_top_ids,
        raw_top_probs=raw_top_probs,
        sampled_top_ids=d.top if d.ids is None else d.ids[d.top],
        sampled_top_probs=top_weights / d.norm,
        raw_prob=raw_prob,
        raw_rank=raw_rank,
        sampled_prob=pick_weight / d.norm,
        sampled_rank=sampled_rank,
        raw_entropy=float(raw_entropy),
        sampled_entropy=d.entropy,
        kept=d.n,
        stages=tuple(reports),
        basis=(logits, raw, raw.total, d, top_weights),
    )


def _raw_figures(
    logits: np.ndarray,
    raw: RawSoftmax,
    raw_top_ids: np.ndarray,
    raw_top_probs: np.ndarray,
    token_id: int,
    wide: np.ndarray | None,
    both: tuple[int, int] | None = None,
) -> tuple[int, float]:
    """The drawn token's raw rank (wide: the top's logits strictly fall, so a token among them has
    its place for its rank; the top's first has rank 1; `both`: counted already) and raw probability."""
    top_list = raw_top_ids.tolist()
    at = top_list.index(token_id) if token_id in top_list else -1
    if at < 0:
        raw_rank = rank_of(logits, token_id, raw_top_ids, at) if both is None else both[0]
        return raw_rank, raw.prob_of(token_id)
    raw_rank = at + 1 if wide is not None or at == 0 else rank_of(logits, token_id, raw_top_ids, at)
    return raw_rank, float(raw_top_probs[at])
