"""Speculative decoding: the verifying pass, a collaborator of the reply run (run.py).

At the feed-back phase, when a draft is on, the drafter (drafts.py) proposes up to k tokens
to follow the context, k chosen by the measured costs and acceptance (draft_pace.py). One
forward pass then evaluates [the token just drawn, d1 .. dk] with logits at every position.
The run draws from those rows in turn, exactly as the plain loop draws (the same sampler
chain and settings, the penalties' history including the tokens kept so far, the same
seeded generator): row 0 gives the draw the plain pass would have given; a draw equal to
the next draft keeps it (its KV cell is already there) and the next row gives the draw
after it. The first draw that differs from its draft ends the pass: the drawn token is kept
instead (fed back at the next pass, as a plain draw is), the draft's guess is recorded
(`RejectedDraft`) and the later drafts' KV cells are dropped. If every draft is kept, the
last row gives one more token, the pass's own. For a draft that proposes one token
(deterministic: prompt lookup, a greedy draft model) this is the speculative-sampling rule
min(1, p/q) with its residual draw: the replies' distribution is the model's.

Every step the pass gave is a full Step from its own row, with the pass's `PassReport`
(passes.py), given out when the pass ends. Not used in step mode, with the logit lens, or for
a branch's given tokens (plain passes there).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from loopchat.engine.draft_pace import DraftPace
from loopchat.engine.sampler import SampleResult
from loopchat.engine.sampler_watch import watched
from loopchat.events import Step
from loopchat.passes import PassReport, RejectedDraft


class Speculation:
    """A reply's verifying passes; each source's drafts paced apart (draft_pace.py)."""

    def __init__(self, host: Any, plan: tuple[tuple[int, int], ...] = ()) -> None:
        self.host = host
        #: a replay's draft lengths by pass number (request.draft_plan; None: the pace chooses)
        self.plan: dict[int, int] | None = dict(plan) if plan else None
        self.drafter: Any = None  # the open (or last) pass's: drafts.LookupDrafter or ModelDrafter
        self.paces: dict[str, DraftPace] = {}
        self.pace = DraftPace(0)
        self.passes = 0  # the reply's passes after its prefill (plain and verifying)
        self.rows: np.ndarray | None = None  # the open pass's logits, a row per position
        self.drafts: list[int] = []
        self.at = 0  # the row the next draw reads
        self.ms = self.draft_ms = 0.0
        self.steps: list[Step] = []

    @property
    def open(self) -> bool:
        """A verifying pass's rows are being drawn from."""
        return self.rows is not None

    def row(self) -> np.ndarray:
        assert self.rows is not None
        return self.rows[self.at]

    def feed(self, token: int, context: Sequence[int], room: int, drafter: Any, draft_max: int) -> float | None:
        """`token` through the model with the drafts that follow it, if the pace asks for
        some and `drafter` has some (`context` ends with `token`; at most `room` drafts):
        the pass's ms; None: nothing was fed (the caller makes a plain pass)."""
        self.drafter = drafter
        self.pace = self.paces.setdefault(drafter.source, DraftPace(draft_max))
        self.pace.draft_max = draft_max
        k = self.pace.length(room) if self.plan is None else min(self.plan.get(self.passes + 1, 0), room)
        if k <= 0:
            return None
        t0 = time.perf_counter()
        drafts = self.drafter.propose(context, k)[:k]
        t1 = time.perf_counter()
        if not drafts:
            self.pace.nothing_found()
            return None
        self.rows = self.host.verify([token, *drafts])  # (RuntimeError: the run's decode failure)
        self.passes += 1
        self.drafts, self.at, self.steps = drafts, 0, []
        self.draft_ms, self.ms = (t1 - t0) * 1000.0, (time.perf_counter() - t1) * 1000.0
        return self.ms

    def plain(self, ms: float) -> None:
        """A plain pass (one token) took `ms` (what every source's draft must beat)."""
        self.passes += 1
        for pace in self.paces.values():
            pace.plain(ms)

    def took(self, step: Step, res: SampleResult, ends: bool) -> list[Step] | None:
        """The step drawn from the current row. None: the pass goes on (its draft was kept);
        else the pass is over: its steps, each with the pass's report (`ends`: the reply ends
        at this step)."""
        i, token = self.at, step.token_id
        guessed = i < len(self.drafts)
        kept = guessed and token == self.drafts[i]
        rejected = None
        if guessed and not kept:
            d = self.drafts[i]
            seen = watched(res, [d])[0]
            rejected = RejectedDraft(d, self.host.piece_text(d), seen.raw_prob, seen.sampled_prob)
        self.steps.append(dataclasses.replace(step, drafted=kept, rejected=rejected))
        if kept:
            if not step.is_stop:  # (an end token is not appended, as in the plain loop)
                self.host.advance()  # the kept draft's cell is the context's now
            if not ends:
                self.at += 1
                return None
        self.host.trim(self.host.n_past)  # the drafts not kept: their KV cells dropped
        n_kept = i + int(kept)
        self.pace.verified(len(self.drafts), n_kept, self.ms, self.draft_ms)
        report = PassReport(
            self.passes, len(self.drafts), n_kept, not kept, self.drafter.source, self.ms, self.draft_ms
        )
        steps, self.steps, self.rows = self.steps, [], None
        return [dataclasses.replace(s, pass_report=report) for s in steps]


def drafter_for(host: Any, source: str) -> Any:
    """The drafter of `source` ("lookup" | "model") on this host; EngineError when it has none."""
    from loopchat.engine.drafts import LookupDrafter
    from loopchat.errors import EngineError

    if source == "lookup":
        return LookupDrafter()
    drafter = getattr(host, "draft_model", None)
    if drafter is None:
        raise EngineError(
            'draft = model needs a draft model: give --draft-model PATH, or `draft = "..."` in the model\'s '
            "models.toml entry"
        )
    return drafter
