"""Tokens on watch (watch.py): each watched token's figures at a step, read from what
the step's draw computed (`SampleResult.basis`), right after it (the next draw reuses
the scratch arrays behind it).

The raw probability and rank are the raw softmax's, as for the drawn token (`raw_prob`,
`raw_rank`: the same arithmetic); the sampled probability and rank are in the
distribution sampled from, as for the drawn token (`sampled_prob`, `sampled_rank`); a
token the settings cut has sampled probability 0 and rank 0. docs/trace-format.md,
"Tokens on watch".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from loopchat.engine.sampler import SampleResult, _sampled_rank, rank_of
from loopchat.engine.sampler_distribution import Distribution
from loopchat.watch import WatchedToken


def watched(res: SampleResult, ids: Sequence[int]) -> tuple[WatchedToken, ...]:
    """The figures of tokens `ids` at the step `res` drew (call it before the next draw)."""
    assert res.basis is not None
    logits, raw, total, _, top_weights = res.basis
    d = distribution_of(res.basis)
    out = []
    for t in ids:
        raw_prob = float(raw.exp_at(np.array([t]))[0]) / total
        raw_rank = rank_of(logits, t, res.raw_top_ids)
        pos = d.position(t)
        if pos is None:
            out.append(WatchedToken(t, raw_prob, raw_rank, 0.0, 0))
            continue
        weight = float(d.weights(np.array([pos]))[0])
        out.append(WatchedToken(t, raw_prob, raw_rank, weight / d.norm, _sampled_rank(d, pos, weight, top_weights)))
    return tuple(out)


def distribution_of(basis: tuple) -> Distribution:
    """The distribution a step drew from, from its SampleResult.basis (sampler_watch): sampler_tail's
    draws keep their probabilities as Python floats (ids, TailDraw), made into one here."""
    d = basis[3]
    if isinstance(d, Distribution):
        return d
    ids, tail = d
    n = len(tail.probs)
    return Distribution(ids, np.array(tail.probs), 1.0, tail.entropy, np.arange(basis[4].shape[0]), None, n)
