"""Step mode: the user's hand on the loop (issue 13).

Sampling is rolling a weighted die. In step mode the loop stops after a forward pass,
just before the roll: the engine emits a `Pending` event (the die: the raw and the
sampled-from distributions of the pending step, no token) and waits here, on a
condition variable (no CPU), until the user

- changes a setting: the engine reshapes the pending distribution from the same logits
  (no forward pass) and emits a new `Pending`;
- draws: `step(n)` lets the sampler draw n tokens, then the loop stops again;
- picks a token: `pick(token_id)` makes it the pending step's token (recorded with
  `Step.chosen_by == "hand"` and its probability in both distributions);
- resumes the free-running loop (`resume`), or cancels (the engine's cancel wakes the
  wait through `wake`).

One object is shared by the thread that asks (the UI) and the engine's thread; every
method is safe from either. Nothing here imports Textual or llama.cpp.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal

#: Step.chosen_by: how a step's token was chosen (the strings traces and the history store)
ChosenBy = Literal["sampled", "step", "hand"]
SAMPLED: Final = "sampled"  # drawn by the sampler, the loop running freely
STEPPED: Final = "step"  # drawn by the sampler when the user asked for a draw in step mode
HAND: Final = "hand"  # picked by the user in step mode


class DecisionKind(Enum):
    """What the user decided while the loop waited before a draw."""

    DRAW = "draw"  # draw with the settings shown (a granted draw, or the loop resumed)
    PICK = "pick"  # take this token (Decision.token_id)
    RESHAPE = "reshape"  # the settings changed: show the same draw under the new ones
    CANCEL = "cancel"  # the run stops


@dataclass(frozen=True)
class Decision:
    """What the waiting loop is to do next."""

    kind: DecisionKind
    token_id: int | None = None  # for PICK
    chosen_by: ChosenBy = STEPPED  # for DRAW: STEPPED, or SAMPLED when the loop was resumed; HAND for PICK


class StepControl:
    def __init__(self, paused: bool = False) -> None:
        self._cond = threading.Condition()
        self._paused = paused
        self._credits = 0  # draws granted while paused (step(n))
        self._pick: int | None = None
        self._waiting = False  # the loop is stopped before a draw

    # ---- the asking side (the UI) ------------------------------------------------------
    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def waiting(self) -> bool:
        """The loop is stopped before a draw (a Pending event shows its die)."""
        return self._waiting

    def pause(self) -> None:
        """Stop before the next draw (after the forward pass in progress)."""
        with self._cond:
            self._paused = True
            self._credits = 0
            self._cond.notify_all()

    def resume(self) -> None:
        """Run freely again (a pending draw is drawn now)."""
        with self._cond:
            self._paused = False
            self._credits = 0
            self._cond.notify_all()

    def step(self, n: int = 1) -> None:
        """Draw `n` tokens with the current settings, then stop again."""
        if n < 1:
            raise ValueError("step(n) needs n >= 1")
        with self._cond:
            self._credits += n
            self._cond.notify_all()

    def pick(self, token_id: int) -> None:
        """The pending step takes this token (any token of the vocabulary)."""
        with self._cond:
            self._pick = int(token_id)
            self._cond.notify_all()

    def wake(self) -> None:
        """Something the waiting loop reads changed (the settings; a cancel)."""
        with self._cond:
            self._cond.notify_all()

    # ---- the engine's side -----------------------------------------------------------------
    def should_stop(self) -> bool:
        """Called before each draw: stop there? (A granted draw is taken instead.)"""
        with self._cond:
            if not self._paused or self._pick is not None:
                return self._paused
            if self._credits > 0:
                return False
            return True

    def take_credit(self) -> ChosenBy:
        """How the draw about to happen without a stop is chosen (a granted draw counts)."""
        with self._cond:
            if self._paused and self._credits > 0:
                self._credits -= 1
                return STEPPED
            return SAMPLED

    def wait(self, cancelled: Callable[[], bool], reshaped: Callable[[], bool]) -> Decision:
        """Wait (no CPU) until the user decides; `reshaped()` says the settings changed
        since the pending distribution was computed, `cancelled()` that the run stops."""
        with self._cond:
            self._waiting = True
            try:
                while True:
                    if cancelled():
                        return Decision(DecisionKind.CANCEL)
                    if reshaped():
                        return Decision(DecisionKind.RESHAPE)
                    if self._pick is not None:
                        token, self._pick = self._pick, None
                        return Decision(DecisionKind.PICK, token_id=token, chosen_by=HAND)
                    if not self._paused:
                        return Decision(DecisionKind.DRAW, chosen_by=SAMPLED)
                    if self._credits > 0:
                        self._credits -= 1
                        return Decision(DecisionKind.DRAW, chosen_by=STEPPED)
                    self._cond.wait()
            finally:
                self._waiting = False


__all__ = ["HAND", "SAMPLED", "STEPPED", "ChosenBy", "Decision", "DecisionKind", "StepControl"]
