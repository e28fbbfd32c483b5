"""What the speculative tests share: two replies' tokens compared, a near-tie that a batched
pass's rounding flipped named rather than hidden (tests/test_speculative.py's docstring)."""

from __future__ import annotations

import warnings

from loopchat.events import Step

#: the largest probability gap a batched pass's rounding was measured to move (a near-tie below it)
NEAR_TIE = 0.12


def same_or_near_tie(plain: list[Step], spec: list[Step]) -> int | None:
    """None: the same tokens; else the first step where they part, checked to be a near-tie
    (the other reply's token within NEAR_TIE of the chosen one in both raw distributions), said
    as a warning."""
    a, b = [s.token_id for s in plain], [s.token_id for s in spec]
    if a == b:
        return None
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert i < min(len(a), len(b)), f"one reply is the other's start: {len(a)} and {len(b)} tokens"
    for step, other in ((plain[i], b[i]), (spec[i], a[i])):
        probs = {c.token_id: c.prob for c in step.raw_top}
        assert other in probs and probs[step.token_id] - probs[other] < NEAR_TIE, (i, step.piece, step.raw_top[:3])
    warnings.warn(
        f"step {i}: a near-tie flipped by a batched pass's rounding ({plain[i].piece!r} / {spec[i].piece!r})",
        stacklevel=2,
    )
    return i
