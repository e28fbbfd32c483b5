"""How many tokens to draft at the next pass (speculative decoding, speculate.py): the draft
length that the measured pass costs and the measured acceptance say pays most, or none.

A verifying pass of k drafts costs c(k+1) ms (measured on the spot: a one-position pass,
and each further position's cost), plus the drafting (measured per drafted token). With a
per-draft acceptance a (the share of drafts kept, over recent passes, decayed), it gives
on average E(k) = 1 + a + a^2 + ... + a^k tokens (the drafts up to the first refused one,
plus the pass's own). The length chosen maximises E(k) / cost(k); when even the best is
not faster than a plain pass (one token per c(1)), the run drafts nothing for a while
(`BACKOFF` passes, doubling while it keeps failing, up to `BACKOFF_MAX`), then tries one
draft (a probe: cheap, and what lets a stretch the context repeats be found again). The
acceptance starts from a prior of 0.9 (`PRIOR_KEPT` of `PRIOR_TRIALS`, decayed as any count): a first try is a real one.
Pure: no model, no clock.
"""

from __future__ import annotations

#: plain passes after a failed bet before drafting again (doubled while failing, capped)
BACKOFF, BACKOFF_MAX = 4, 64
#: the weight of the past in the decayed figures (per pass)
DECAY = 0.8
#: a draft must promise this much over a plain pass to be tried
MARGIN = 1.02
#: the acceptance's prior: drafts kept of drafts checked
PRIOR_KEPT, PRIOR_TRIALS = 4.5, 5.0


class DraftPace:
    def __init__(self, draft_max: int) -> None:
        self.draft_max = draft_max
        self.plain_ms: float | None = None  # a one-position pass (decayed mean)
        self.slope_ms: float | None = None  # each further position of a pass
        self.draft_token_ms = 0.0  # drafting, per drafted token
        #: decayed counts of drafts kept, and checked up to a refusal (from the prior, which decays too)
        self._kept, self._trials = PRIOR_KEPT, PRIOR_TRIALS
        self._rest = 0  # plain passes still to make before drafting again
        self._backoff = BACKOFF
        self._probe = False  # the pass after a back-off tries one draft
        self.chosen: list[int] = []  # the length chosen at each verifying pass (the benchmark reports it)

    @property
    def acceptance(self) -> float:
        """The share of drafts kept, over the decayed counts."""
        return self._kept / self._trials if self._trials > 0 else 0.0

    def expected(self, k: int) -> float:
        a = self.acceptance
        return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)

    def cost(self, k: int) -> float:
        assert self.plain_ms is not None
        slope = self.slope_ms if self.slope_ms is not None else 0.5 * self.plain_ms
        return self.plain_ms + k * (slope + self.draft_token_ms)

    def gain(self, k: int) -> float:
        """The decode rate k drafts promise, over a plain pass's."""
        assert self.plain_ms is not None
        return self.expected(k) * self.plain_ms / self.cost(k)

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
        if self.gain(best) < MARGIN:
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
        if self.plain_ms is not None and drafted > 0:
            slope = max(0.0, (ms - self.plain_ms) / drafted)
            self.slope_ms = slope if self.slope_ms is None else DECAY * self.slope_ms + (1 - DECAY) * slope
            per = draft_ms / drafted
            self.draft_token_ms = DECAY * self.draft_token_ms + (1 - DECAY) * per
        trials = kept + (1 if kept < drafted else 0)
        self._kept = DECAY * self._kept + kept
        self._trials = DECAY * self._trials + trials
        if kept == drafted:
            self._backoff = BACKOFF  # a bet that paid: back off briefly next time

    def nothing_found(self) -> None:
        """The drafter had nothing to propose (prompt lookup found no match): a plain pass."""
