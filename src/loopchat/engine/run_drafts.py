"""The reply run's side of speculative decoding (run.py; the verifying pass: speculate.py):
whether the next feed-back drafts, with which drafter and how many tokens at most, and the
steps of a verifying pass given out when it ends.

A pass drafts when the request has a prediction (OpenAI's Predicted Outputs: its tokens are
the drafts) or the settings' `draft` is "lookup" or "model", the loop is not in step mode
(paused: one token per pass), the logit lens is not asked for (it reads one position per
pass), and the next step is not a branch's given token. The settings are read at each pass,
so a change of `draft` or `draft_max` applies at the next one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from loopchat.engine.drafts import PredictionDrafter
from loopchat.engine.sampler import SampleResult
from loopchat.engine.speculate import Speculation, drafter_for
from loopchat.errors import EngineError
from loopchat.events import Step
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings


class RunDrafts:
    def __init__(self, host: Any, request: ReplyRequest) -> None:
        self.host = host
        self.request = request
        self.spec = Speculation(host, request.draft_plan)
        self._drafters: dict[str, Any] = {}

    def check(self, settings: SamplingSettings) -> None:
        """EngineError (before any event) for a draft this host cannot make."""
        if (source := self._source(settings)) != "off":
            self._drafter(source)

    def _source(self, settings: SamplingSettings) -> str:
        """What drafts now: a request's prediction, else the settings' `draft`."""
        return "prediction" if self.request.prediction else settings.draft

    def _drafter(self, source: str) -> Any:
        drafter = self._drafters.get(source)
        if drafter is None:
            if source == "prediction":
                drafter = PredictionDrafter(self.host.text_tokens(self.request.prediction))
            else:
                drafter = drafter_for(self.host, source)
            self._drafters[source] = drafter
        return drafter

    @property
    def open(self) -> bool:
        """A verifying pass's rows give the next draws."""
        return self.spec.open

    def row(self) -> np.ndarray:
        return self.spec.row()

    def feed(self, token: int, run: Any) -> tuple[float, int] | None:
        """The feed-back of `token` as a verifying pass, if the run drafts now and the drafter
        proposes: (the pass's ms, its positions); None: the caller makes a plain pass."""
        settings, host, control = run.settings.now, self.host, run.gate.control
        source = self._source(settings)
        if source == "off" or (control is not None and control.paused) or self.request.lens:
            return None
        if run.branch.given(run.steps) is not None:
            return None
        try:
            drafter = self._drafter(source)
        except EngineError:  # (a live change to a source this host has not: plain passes)
            return None
        room = min(host.n_ctx - host.n_past - 3, settings.max_tokens - run.completion - 1)
        ms = self.spec.feed(token, run.context, room, drafter, settings.draft_max)
        return None if ms is None else (ms, 1 + len(self.spec.drafts))

    def plain(self, ms: float) -> None:
        self.spec.plain(ms)

    def took(self, step: Step, res: SampleResult, ends: bool, clock: Any) -> Iterator[Step]:
        """The steps to give out after `step` is recorded: itself (a plain pass's), none yet
        (a verifying pass goes on), or the verifying pass's steps, each with its report."""
        if not self.spec.open:
            yield step
            return
        clock.forward_ms, clock.forward_tokens = 0.0, 0  # the pass's later steps: its ms is on its first
        steps = self.spec.took(step, res, ends)
        if steps is not None:
            yield from steps
