"""What one stage of the sampler did at one step (engine/sampler_stages.py): a contract
the Step event carries, the trace, the history and the wire record, and the panel's
waterfall shows (docs/trace-format.md, "Sampler stages").

Masses are shares of one distribution: the softmax, at temperature 1, of the logits after
the stages that change logits (repeat penalty, DRY, logit bias), over the whole vocabulary.
"""

from __future__ import annotations

from typing import NamedTuple


class StageReport(NamedTuple):
    """One stage at one step (a row of the waterfall)."""

    stage: str  # repeat_penalty, dry, logit_bias, top_k, top_p, min_p, temperature, greedy
    removed: int  # candidates it removed
    removed_mass: float  # the probability they held
    kept: int  # candidates left after it
    kept_mass: float  # the probability those held
    #: the most likely token it removed (largest logit after the logit changes; equal ones:
    #: the first in the chain's order, the lowest id for a sort) and its probability; -1, 0.0: none removed
    cut_id: int = -1
    cut_prob: float = 0.0
    #: a stage that changes logits (penalties, bias): how many tokens' logits it changed, and
    #: the mass it moved: the total variation distance between the softmax before and after it
    changed: int = 0
    moved_mass: float = 0.0
    #: the cut token's text as the panel shows it (its bytes decoded; the engine fills it in, "" unknown)
    cut_text: str = ""

    @property
    def did_nothing(self) -> bool:
        return self.removed == 0 and self.changed == 0


def stage_reports(rows: object) -> tuple[StageReport, ...]:
    """Reports from their stored form (lists from JSON or msgpack; an older record: none)."""
    if not rows:
        return ()
    return tuple(StageReport(*r) for r in rows)  # type: ignore[attr-defined]


def with_cut_text(r: StageReport, text: str) -> StageReport:
    """The report with its cut token's text filled in (the engine's: it has the vocabulary)."""
    return StageReport(*r[:-1], text)
