"""The draft pace (engine/draft_pace.py) on synthetic pass costs: a run of passes where a pass
of n positions costs c(n) ms and each draft is kept with probability a (seeded), the pace
choosing each length. It must settle on the length the true costs favour, concave (a CPU's
batch: the second position the dearest) or linear, and back off when acceptance is poor.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable

import pytest

from loopchat.engine import draft_pace
from loopchat.engine.draft_pace import EXPLORE_EVERY, DraftPace

Cost = Callable[[int], float]

#: this machine's rename (docs/performance.md): c(1) 11.8, c(2) 18.6, c(6) 34.6 ms
CONCAVE: Cost = lambda n: 11.8 + 6.8 * (n - 1) ** 0.66  # noqa: E731
#: the issue's bare passes: 1 -> 8.7 ms, 3 -> 22.4, 5 -> 30, 9 -> 44
ISSUE: Cost = lambda n: 8.7 + 9.69 * math.sqrt(n - 1)  # noqa: E731
LINEAR: Cost = lambda n: 10.0 + 3.0 * (n - 1)  # noqa: E731
STEEP: Cost = lambda n: 10.0 + 8.0 * (n - 1)  # noqa: E731


def true_gain(cost: Cost, a: float, k: int) -> float:
    """k drafts' decode rate over a plain pass's, from the true costs and acceptance."""
    return (1 - a ** (k + 1)) / (1 - a) * cost(1) / cost(k + 1)


def run(cost: Cost, a: float, passes: int = 600, seed: int = 1) -> tuple[DraftPace, float]:
    """(the pace after `passes` passes, the run's decode rate over the plain loop's)."""
    pace, rng = DraftPace(8), random.Random(seed)
    tokens, ms = 0, 0.0
    for _ in range(passes):
        k = pace.length(8)
        if k == 0:
            pace.plain(cost(1))
            tokens, ms = tokens + 1, ms + cost(1)
            continue
        kept = 0
        while kept < k and rng.random() < a:
            kept += 1
        pace.verified(k, kept, cost(k + 1), 0.0)
        tokens, ms = tokens + kept + 1, ms + cost(k + 1)
    return pace, tokens / ms * cost(1)


@pytest.mark.parametrize(
    ("cost", "a"),
    [(CONCAVE, 0.82), (CONCAVE, 0.9), (ISSUE, 0.9), (LINEAR, 0.82)],
    ids=["concave-0.82", "concave-0.9", "issue-0.9", "linear-0.82"],
)
def test_the_pace_settles_near_the_length_the_true_costs_favour(cost: Cost, a: float) -> None:
    best = max(range(1, 9), key=lambda k: true_gain(cost, a, k))
    pace, rate = run(cost, a)
    late = Counter(pace.chosen[len(pace.chosen) // 2 :])
    mean_gain = sum(true_gain(cost, a, k) * n for k, n in late.items()) / late.total()
    # the lengths it chose late in the run promise (on average) >= 0.9 of the best's, and the
    # run as a whole made >= 0.85 of the best's rate (its start, its acceptance's noise)
    assert mean_gain >= 0.9 * true_gain(cost, a, best), (best, late)
    assert rate >= 0.85 * true_gain(cost, a, best), (rate, best, late)


def test_on_a_concave_cost_a_pace_that_drafted_one_token_tries_longer_ones() -> None:
    """The rename's trap: c(2) - c(1) extrapolated linearly makes k = 5 look dear, where the
    true c(6) makes it pay. After one-draft passes, the pace tries a longer draft (once per
    EXPLORE_EVERY verifying passes at most), and keeps it when its measured cost pays."""
    pace = DraftPace(8)
    pace.plain(CONCAVE(1))
    for _ in range(3):
        pace.verified(1, 1, CONCAVE(2), 0.0)
        pace.verified(1, 0, CONCAVE(2), 0.0)
    pace._kept, pace._trials = 0.82 * 5, 5.0  # (the rename's acceptance, pooled and at the first position)
    pace.by_position = {1: (0.82 * 5, 5.0)}
    linear = CONCAVE(1) + 5 * (CONCAVE(2) - CONCAVE(1))  # what a linear pace thinks k = 5 costs
    assert pace.cost(5) == pytest.approx(linear) and pace.cost(5) > 1.3 * CONCAVE(6)
    k = pace.length(8)
    assert k > 2 and pace.explored == [k]
    pace.verified(k, k, CONCAVE(k + 1), 0.0)  # measured: the pace now reads its true cost
    assert pace.pass_cost(k + 1) == pytest.approx(CONCAVE(k + 1))
    following = [pace.length(8) for _ in range(EXPLORE_EVERY - 1)]
    assert pace.explored == [k] and min(following) > 1, following  # no new try before EXPLORE_EVERY


def test_the_tries_of_unmeasured_lengths_are_bounded() -> None:
    """Each try measures a length, and only lengths past the largest measured are tried: at
    most draft_max tries in a reply, however long."""
    pace, _ = run(ISSUE, 0.75, passes=2000)
    assert len(pace.explored) <= 8 and pace.explored == sorted(pace.explored), pace.explored


@pytest.mark.parametrize("cost", [CONCAVE, ISSUE, LINEAR, STEEP], ids=["concave", "issue", "linear", "steep"])
def test_the_pace_backs_off_when_drafts_keep_failing(cost: Cost) -> None:
    pace, rate = run(cost, 0.2)
    assert len(pace.chosen) < 60, Counter(pace.chosen)  # of 600 passes
    assert len(pace.explored) <= 1, pace.explored  # (no tries of longer drafts while drafting does not pay)
    assert rate >= 0.95, rate


def test_a_steep_linear_cost_keeps_the_drafts_short() -> None:
    pace, rate = run(STEEP, 0.82)
    late = Counter(pace.chosen[len(pace.chosen) // 2 :])
    assert late.most_common(1)[0][0] == 1 and rate >= 0.97, (late, rate)  # (k = 1 is the best: 1.01)


def test_costs_between_measured_lengths_are_read_on_the_line_between_them() -> None:
    pace = DraftPace(8)
    pace.plain(10.0)
    assert pace.pass_cost(3) == 20.0  # before any verifying pass: half a plain pass a position
    pace.verified(1, 1, 16.0, 0.0)
    pace.verified(5, 5, 30.0, 0.0)
    assert pace.pass_cost(4) == pytest.approx(16.0 + 14.0 * 2 / 4)
    assert pace.pass_cost(8) == pytest.approx(30.0 + 3.5 * 2)  # the last segment's slope
    assert pace.pass_cost(8, guess=True) == pytest.approx(10.0 + 20.0 * math.sqrt(7 / 5))


def test_a_load_that_slows_every_pass_alike_leaves_the_costs_ratios_alone() -> None:
    """c(4) measured in a quiet minute, then the plain passes four times slower (a busy one):
    a 4-position pass is priced at its ratio to the plain pass now, not its stale 20 ms (which
    against a 40 ms plain pass would make every draft look nearly free)."""
    pace = DraftPace(8)
    pace.plain(10.0)
    pace.verified(3, 0, 20.0, 0.0)
    for _ in range(30):
        pace.plain(40.0)
    assert pace.pass_cost(4) == pytest.approx(80.0, rel=0.01)


def fixed_place_run(monkeypatch: pytest.MonkeyPatch, prior: float) -> Counter[int]:
    monkeypatch.setattr(draft_pace, "POSITION_PRIOR", prior)
    pace = DraftPace(8)
    pace.plain(CONCAVE(1))
    for _ in range(200):
        k = pace.length(8)
        if k == 0:
            pace.plain(CONCAVE(1))
        else:
            pace.verified(k, min(k, 3), CONCAVE(k + 1), 0.0)
    return Counter(pace.chosen[len(pace.chosen) // 2 :])


def test_refusals_at_a_fixed_place_are_read_by_position(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy that always parts from its source at the 4th draft (a rename's renamed word): the
    first three drafts are always kept, the 4th always refused. By position a_1..a_3 = 1 and
    a_4 = 0: E(k) = 4 for every k >= 3, so three drafts (the cheapest pass giving 4 tokens) is
    the length that pays; now and then a longer one is tried again (a position not checked for
    a while reads near the pooled acceptance). A pooled per-draft acceptance alone (the prior
    outweighing every count) promised longer drafts more than the record gives."""
    late = fixed_place_run(monkeypatch, draft_pace.POSITION_PRIOR)
    assert late.most_common(1)[0][0] == 3 and late[3] >= 0.75 * late.total(), late
    pooled = fixed_place_run(monkeypatch, 1e9)
    assert pooled[3] < 0.5 * pooled.total(), pooled
