"""Step mode in the reply run (a collaborator of run.py; the user's side is step_control.py).

Before a draw the run asks `stops()`. If the loop is to stop there, `hold()` shows the die
before the roll: it samples the pending draw (the very draw a free run makes: the
generator's state is kept to redo the draw under new settings, or to leave it to a hand
pick), yields a `Pending`, and waits for the user's decision, reshaping the die (the same
logits, no forward pass) as often as the settings change. It returns the draw decided
on, or None for a cancel. While it waits, `probe` holds the pending draw's inputs
(Engine.pending_probs reads them from another thread). Needs no model: logits, the
context and the settings are handed in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from loopchat.engine.run_settings import ReplySettings
from loopchat.engine.sampler import SampleResult, make_rng, sample
from loopchat.events import Pending
from loopchat.settings import SamplingSettings
from loopchat.step_control import SAMPLED, ChosenBy, DecisionKind, StepControl


@dataclass(slots=True)
class Drawn:
    """A draw's outcome: the sampler's result, how the token was chosen, and the time the
    draw began (`sample_ms` measured then; None: measured once the step's text is known)."""

    result: SampleResult
    chosen_by: ChosenBy
    started: float
    sample_ms: float | None = None


@dataclass(frozen=True, slots=True)
class PendingDraw:
    """What a pending draw is computed from."""

    logits: np.ndarray
    context: Sequence[int]
    report_k: int
    n_vocab: int
    #: the Pending event for a result (settings, sample_ms): the run fills in its place
    show: Callable[[SampleResult, SamplingSettings, float], Pending]
    constraint: Any = None  # the reply's constraint stage (sampler_constraint), if any


def _ms_since(t: float) -> float:
    return (time.perf_counter() - t) * 1000.0


class StepGate:
    def __init__(self, control: StepControl | None, cancelled: Callable[[], bool]) -> None:
        self.control = control
        self._cancelled = cancelled
        self.paused_s = 0.0  # the waits for the user so far
        #: while stopped: (logits, context, settings) of the pending draw
        self.probe: tuple[np.ndarray, Sequence[int], SamplingSettings] | None = None

    def stops(self) -> bool:
        """Stop before this draw? (A draw granted by step(n) is taken instead.)"""
        return self.control is not None and self.control.should_stop()

    def credit(self) -> ChosenBy:
        """How a draw made without a stop is chosen (a granted draw counts as a step)."""
        return SAMPLED if self.control is None else self.control.take_credit()

    def hold(
        self, draw: PendingDraw, settings: ReplySettings, started: float
    ) -> Generator[Pending, None, Drawn | None]:
        """Show the pending draw, wait for the user; the draw decided on (None: cancelled)."""
        assert self.control is not None
        state = settings.rng.bit_generator.state
        res, sample_ms = self._sample(draw, settings, None, started)
        yield self._pending(draw, res, settings.now, sample_ms)
        try:
            while True:
                tw = time.perf_counter()
                decision = self.control.wait(self._cancelled, settings.moved)
                self.paused_s += time.perf_counter() - tw
                if decision.kind is DecisionKind.CANCEL:
                    return None
                ts = time.perf_counter()
                if decision.kind is DecisionKind.RESHAPE:  # the same logits, no forward pass
                    state = settings.reshape(state)
                    res, sample_ms = self._sample(draw, settings, None, ts)
                    yield self._pending(draw, res, settings.now, sample_ms)
                    continue
                if decision.kind is DecisionKind.PICK:
                    if not 0 <= (decision.token_id or 0) < draw.n_vocab:
                        continue  # not a token of this vocabulary: keep waiting
                    refused = None if draw.constraint is None else draw.constraint.refusal(decision.token_id)
                    if refused is not None:  # the grammar could not go on: keep waiting, say why
                        shown = self._pending(draw, res, settings.now, sample_ms)
                        yield replace(shown, refused=f"{refused}: pick a token it allows, or draw (Enter)")
                        continue
                    settings.rng.bit_generator.state = state  # nothing was drawn
                    res, sample_ms = self._sample(draw, settings, decision.token_id, ts)
                return Drawn(res, decision.chosen_by, started, sample_ms)
        finally:
            self.probe = None

    @staticmethod
    def _sample(draw: PendingDraw, settings: ReplySettings, force: int | None, ts: float) -> tuple[SampleResult, float]:
        res = sample(
            draw.logits,
            draw.context,
            settings.now,
            settings.rng,
            draw.report_k,
            force=force,
            constraint=draw.constraint,
        )
        return res, _ms_since(ts)

    def _pending(self, draw: PendingDraw, res: SampleResult, s: SamplingSettings, sample_ms: float) -> Pending:
        self.probe = (draw.logits, draw.context, s)
        return draw.show(res, s, sample_ms)


def probe_probs(
    probe: tuple[np.ndarray, Sequence[int], SamplingSettings] | None,
    token_ids: Sequence[int],
    n_vocab: int,
    constraint: Any = None,
) -> list[tuple[float, float]] | None:
    """Step mode: the probability of each of these tokens at the draw the loop is stopped
    before (`probe`: StepGate.probe), raw and after sampling (0: the filters cut it), from the
    same logits and settings as the Pending shown. None when the loop is not stopped. Safe
    from another thread while the loop waits (it reads, the loop does not run)."""
    if probe is None:
        return None
    logits, history, settings = probe
    rng = make_rng(0)  # (not used by a forced token)
    out = []
    for t in token_ids:
        if not 0 <= int(t) < n_vocab:
            out.append((0.0, 0.0))
            continue
        res = sample(logits, history, settings, rng, 1, force=int(t), constraint=constraint)
        out.append((float(res.raw_prob), float(res.sampled_prob or 0.0)))
    return out
