"""How many tokens to draft at the next pass (speculative decoding, speculate.py): the draft
length that the measured pass costs and the measured acceptance say pays most, or none.

A verifying pass of k drafts costs c(k+1) ms, plus the drafting (measured per drafted token).
c(n) is kept by the number of positions n, as measured: c(1) from the plain passes, c(n) from
the verifying passes of n - 1 drafts as a ratio to c(1) at the time (each a decayed mean: a
load that slows every pass alike, measured at another minute, leaves the ratios alone where a
stale absolute c(n) against a fresh c(1) would make drafting look cheap or dear). On a CPU a
pass's cost is concave in its positions (the second position dearer than the sixth), so the
costs are not one slope: between two measured n a cost is read on the line between them; past
the largest measured n it goes on at the last measured segment's slope (what a concave cost
does not exceed: the estimate the pace acts on), and before any verifying pass at half a plain
pass a position.
The acceptance is kept by draft position: a_i, the share of the i-th drafts kept among those
checked (the drafts before them kept), each a decayed count (`POSITION_DECAY`). k drafts give on
average E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k tokens (the drafts up to the first refused
one, plus the pass's own). A copy's refusals cluster (a rename's fall at each renamed word, a
repeat's long runs are kept whole), so a_i is far from one figure for every position: a single
per-draft acceptance a (E(k) = 1 + a + ... + a^k) made long drafts look dearer or cheaper than
the record said. Each position's figure has `POSITION_PRIOR` checks at the pooled per-draft
acceptance (`acceptance`, over recent passes) beside its own: a position seldom checked (a long
draft not tried for a while) reads near the pool, not at one old refusal. The length chosen
maximises E(k) / cost(k).

A pace that drafts one token learns only c(2), and the last slope from c(1) to c(2) makes
every longer pass look dear: so now and then (`EXPLORE_EVERY` verifying passes apart), while
drafting pays, it tries a length it has not measured, when a concave guess past the largest
measured n (c(1) plus the last measured rise times the square root of the ratio of the further
positions) says that length would beat the best measured one. One pass at that length
measures it; from then on the measured cost is used (so at most `draft_max` tries a reply).

When even the best is not faster than a plain pass (one token per c(1)), the run drafts
nothing for a while (`BACKOFF` passes, doubling while it keeps failing, up to `BACKOFF_MAX`),
then tries one draft (a probe: cheap, and what lets a stretch the context repeats be found
again). The acceptance starts from a prior of 0.9 (`PRIOR_KEPT` of
`PRIOR_TRIALS`, decayed as any count): a first try is a real one. Pure: no model, no clock.
"""

from __future__ import annotations

import math

#: plain passes after a failed bet before drafting again (doubled while failing, capped)
BACKOFF, BACKOFF_MAX = 4, 64
#: the weight of the past in the decayed figures (per pass)
DECAY = 0.8
#: a draft must promise this much over a plain pass to be tried
MARGIN = 1.02
#: the acceptance's prior: drafts kept of drafts checked
PRIOR_KEPT, PRIOR_TRIALS = 4.5, 5.0
#: verifying passes between two tries of a length not measured yet
EXPLORE_EVERY = 8
#: the weight of the past in the acceptance by position (per verifying pass), and the checks at
#: the pooled acceptance each position's figure starts from (one refusal does not make it 0)
POSITION_DECAY, POSITION_PRIOR = 0.95, 1.0


class DraftPace:
    def __init__(self, draft_max: int) -> None:
        self.draft_max = draft_max
        self.plain_ms: float | None = None  # a one-position pass (decayed mean)
        #: a verifying pass's ms by the positions it held, over the plain pass's ms at the time
        #: (a load that slows every pass alike leaves these alone), each a decayed mean
        self.ratio: dict[int, float] = {1: 1.0}
        self.draft_token_ms = 0.0  # drafting, per drafted token
        #: decayed counts of drafts kept, and checked up to a refusal (from the prior, which decays too)
        self._kept, self._trials = PRIOR_KEPT, PRIOR_TRIALS
        #: by draft position (1 = the first draft): decayed (kept, checked) counts
        self.by_position: dict[int, tuple[float, float]] = {}
        self._rest = 0  # plain passes still to make before drafting again
        self._backoff = BACKOFF
        self._probe = False  # the pass after a back-off tries one draft
        self._since_explore = EXPLORE_EVERY  # verifying passes since a length was last tried unmeasured
        self.chosen: list[int] = []  # the length chosen at each verifying pass (the benchmark reports it)
        self.explored: list[int] = []  # the lengths tried unmeasured (tests/test_draft_pace.py reads them)

    @property
    def acceptance(self) -> float:
        """The share of drafts kept, over the decayed counts."""
        return self._kept / self._trials if self._trials > 0 else 0.0

    def position_acceptance(self, i: int) -> float:
        """a_i: the share of i-th drafts kept among those checked, with `POSITION_PRIOR` checks
        at the pooled acceptance beside them (a position seldom checked reads near the pool)."""
        kept, checked = self.by_position.get(i, (0.0, 0.0))
        return (kept + POSITION_PRIOR * self.acceptance) / (checked + POSITION_PRIOR)

    def expected(self, k: int) -> float:
        """E(k): the tokens a pass of k drafts gives on average (its own one included)."""
        e = reach = 1.0
        for i in range(1, k + 1):
            reach *= self.position_acceptance(i)
            e += reach
        return e

    def pass_cost(self, n: int, guess: bool = False) -> float:
        """c(n): measured, or read between two measured n, or past the largest measured n at
        the last measured slope (`guess`: at the concave guess instead)."""
        assert self.plain_ms is not None
        return self.plain_ms * self._ratio_at(n, guess)

    def _ratio_at(self, n: int, guess: bool) -> float:
        r = self.ratio
        if n in r:
            return r[n]
        known = sorted(r)
        low = max(m for m in known if m < n)  # (1 is known)
        high = next((m for m in known if m > n), None)
        if high is not None:
            return r[low] + (r[high] - r[low]) * (n - low) / (high - low)
        if low == 1:
            return 1.0 + 0.5 * (n - 1)
        if guess:
            return 1.0 + max(0.0, r[low] - 1.0) * math.sqrt((n - 1) / (low - 1))
        before = max(m for m in known if m < low)
        slope = max(0.0, (r[low] - r[before]) / (low - before))
        return r[low] + slope * (n - low)

    def cost(self, k: int, guess: bool = False) -> float:
        return self.pass_cost(k + 1, guess) + k * self.draft_token_ms

    def gain(self, k: int, guess: bool = False) -> float:
        """The decode rate k drafts promise, over a plain pass's."""
        assert self.plain_ms is not None
        return self.expected(k) * self.plain_ms / self.cost(k, guess)

    def length(self, room: int) -> int:
        """The drafts to ask for now (0: a plain pass). `room`: the most that fit."""
        limit = min(self.draft_max, room)
        if limit <= 0 or self.plain_ms is None:
            return 0  # (a plain pass first: its cost is what a draft must beat)
        if self._rest > 0:
            self._rest -= 1
            return 0
        if self._probe:
            self._probe = False
            return 1
        best = max(range(1, limit + 1), key=self.gain)
        top = self.gain(best)
        if top >= MARGIN and self._since_explore >= EXPLORE_EVERY and len(self.ratio) > 1:
            unmeasured = [k for k in range(1, limit + 1) if k + 1 > max(self.ratio)]
            if unmeasured:
                probe = max(unmeasured, key=lambda k: self.gain(k, guess=True))
                if self.gain(probe, guess=True) > max(top, MARGIN):
                    self._since_explore = 0
                    self.explored.append(probe)
                    return probe
        if top < MARGIN:
            self._rest, self._backoff = self._backoff, min(2 * self._backoff, BACKOFF_MAX)
            self._probe = True
            return 0
        return best

    def plain(self, ms: float) -> None:
        """A plain pass took `ms`."""
        self.plain_ms = ms if self.plain_ms is None else DECAY * self.plain_ms + (1 - DECAY) * ms

    def verified(self, drafted: int, kept: int, ms: float, draft_ms: float) -> None:
        """A verifying pass of `drafted` drafts (drafted + 1 positions) kept `kept` of them."""
        self.chosen.append(drafted)
        self._since_explore += 1
        if self.plain_ms is not None and drafted > 0:
            old, ratio = self.ratio.get(drafted + 1), ms / self.plain_ms
            self.ratio[drafted + 1] = ratio if old is None else DECAY * old + (1 - DECAY) * ratio
            self.draft_token_ms = DECAY * self.draft_token_ms + (1 - DECAY) * draft_ms / drafted
        trials = kept + (1 if kept < drafted else 0)
        self._kept = DECAY * self._kept + kept
        self._trials = DECAY * self._trials + trials
        for i in range(1, max(trials, max(self.by_position, default=0)) + 1):
            k, n = self.by_position.get(i, (0.0, 0.0))  # checked: those kept and the first refused
            checked = i <= trials
            self.by_position[i] = (POSITION_DECAY * k + (checked and i <= kept), POSITION_DECAY * n + checked)
        if kept == drafted:
            self._backoff = BACKOFF  # a bet that paid: back off briefly next time

    def nothing_found(self) -> None:
        """The drafter had nothing to propose (prompt lookup found no match): a plain pass."""
