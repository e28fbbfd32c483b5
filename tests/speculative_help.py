"""What the speculative tests share: two replies' tokens compared, a near-tie that a batched
pass's rounding flipped named rather than hidden (tests/test_speculative.py's docstring)."""

from __future__ import annotations

import warnings

from loopchat.events import Step

#: the largest probability gap a batched pass's rounding was measured to move (a near-tie below it)
NEAR_TIE = 0.12


def same_or_near_tie(plain: list[Step], spec: list[Step], sampled: bool = False) -> int | None:
    """None: the same tokens; else the first step where they part, checked to be explained by
    the batched pass's rounding, and said as a warning. Greedy (`sampled` False): a near-tie,
    the other reply's token within NEAR_TIE of the chosen one in both raw distributions.
    Sampled: the seeded draw's number fell where the rounding moved a boundary of the
    distribution it was drawn from: both tokens are in both steps' sampled distributions, and
    those distributions differ (the draw itself is the same number at the same step)."""
    a, b = [s.token_id for s in plain], [s.token_id for s in spec]
    if a == b:
        return None
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert i < min(len(a), len(b)), f"one reply is the other's start: {len(a)} and {len(b)} tokens"
    moved = 0.0
    for step, twin, other in ((plain[i], spec[i], b[i]), (spec[i], plain[i], a[i])):
        top = step.sampled_top if sampled else step.raw_top
        probs = {c.token_id: c.prob for c in top}
        twin_probs = {c.token_id: c.prob for c in (twin.sampled_top if sampled else twin.raw_top)}
        moved = max([moved, *(abs(p - twin_probs[t]) for t, p in probs.items() if t in twin_probs)])
        if sampled:
            assert other in probs and step.token_id in probs, (i, step.piece, top[:5])
        else:
            assert other in probs and probs[step.token_id] - probs[other] < NEAR_TIE, (i, step.piece, top[:3])
    assert moved > 1e-7, (i, "the distributions are the same: the rounding does not explain the parting")
    warnings.warn(
        f"step {i}: {plain[i].piece!r} / {spec[i].piece!r}: a batched pass's rounding moved the "
        f"{'sampled' if sampled else 'raw'} distribution by up to {moved:.4f}",
        stacklevel=2,
    )
    return i
