"""The settings a reply runs with, pass by pass: a collaborator of the reply run (run.py).

The live source (a LiveSettings: F2, the knobs, a serve request) is read before every
draw; a swapped object is resolved once: an unpinned seed (None) becomes the reply's one
fresh seed, so every event records settings that replay the reply exactly. The random
generator is made anew only when the seed changes, so a draw continues the stream of the
one before it. Pure: no model, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from loopchat.engine.sampler import make_rng
from loopchat.settings import SamplingSettings


class ReplySettings:
    """`now`: the settings of the draw at hand (seed filled in); `rng`: the generator it
    draws with; `previous`: the settings of the last step recorded (None before the first)."""

    def __init__(self, source: Callable[[], SamplingSettings], reply_seed: int) -> None:
        self.source = source
        self.reply_seed = reply_seed
        self.raw = source()
        self.now = self.raw.with_seed(reply_seed)
        self.seed = self.now.seed
        self.rng: np.random.Generator = make_rng(self.seed)
        self.previous: SamplingSettings | None = None

    def refresh(self) -> SamplingSettings:
        """The settings for the next draw: the source's latest, resolved once per object."""
        latest = self.source()
        if latest is not self.raw:  # swapped: resolve its seed once, not per step
            self.raw, self.now = latest, latest.with_seed(self.reply_seed)
        self._reseed()
        return self.now

    def moved(self) -> bool:
        """The source holds other settings than the ones `now` was resolved from."""
        return self.source() is not self.raw

    def reshape(self, state: Any) -> Any:
        """Step mode: the same draw again under the source's latest settings. `state`: the
        generator's state before the draw shown; returns the state to keep for the next
        reshape (the same seed: the same state back, so the new draw is the one a free run
        would make; a new seed: its fresh generator's)."""
        self.raw = self.source()
        self.now = self.raw.with_seed(self.reply_seed)
        if self._reseed():
            return self.rng.bit_generator.state
        self.rng.bit_generator.state = state
        return state

    def changed(self) -> tuple[str, ...]:
        """The fields in which `now` differs from the last recorded step's settings."""
        return self.now.diff(self.previous)

    def recorded(self) -> None:
        """A step was recorded with `now`."""
        self.previous = self.now

    def _reseed(self) -> bool:
        if self.now.seed == self.seed:
            return False
        self.seed = self.now.seed
        self.rng = make_rng(self.seed)
        return True
