"""Lens depth (issue 26, part 1): the layer at which each token of a reply became the
model's choice, for the transcript's colours (Shift+F7).

A token's **lens depth** is the first layer L such that, at every layer from L to the
last, the logit lens of the pass that drew it (engine/lens.py) ranks the drawn token
first (`LensRow.drawn_rank == 1`). Early: the model "knew" it from the first layers on;
the last layer: it decided late. None: the last layer does not rank it first either (the
sampler drew a token that was not the model's top choice). docs/trace-format.md, "The
logit lens", defines the rows; this figure is computed from them alone.

The lens is paid per pass (one more forward pass and the head at every layer:
docs/performance.md), so it is computed when asked, for one reply: the reply's passes
are read again by a run that takes the reply's own tokens in turn (`ReplyRequest.forced`)
with the lens on, exactly as F11 reads one of them (session_lens.py). The depths fill in
as the run's steps come (`ReplyRecord.lens_depths`); a message sent meanwhile stops the
run (the depths so far stay; asking again goes on from the first missing one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from loopchat.chat.conversation import ReplyRecord
from loopchat.chat.session_core import Refused
from loopchat.chat.session_lens import NO_LENS_ON_SERVER, LensRun, check_same_model
from loopchat.events import LensRow, Step
from loopchat.request import ReplyRequest


def lens_depth(rows: Sequence[LensRow]) -> int | None:
    """The first layer from which on every layer ranks the drawn token first (None: the
    last layer does not)."""
    depth = None
    for row in reversed(rows):
        if row.drawn_rank != 1:
            break
        depth = row.layer
    return depth


@dataclass(slots=True)
class DepthProbe(LensRun):
    """The lens depths of one reply being computed: its run's Steps fill `rec.lens_depths`."""

    rec: ReplyRecord
    total: int  # the reply's tokens (its steps before the first stop)
    changed: bool = False  # depths came since the app last looked (it clears this)
    stops_for_a_reply: ClassVar[bool] = True  # (a whole reply's passes: a message goes first)

    def on_step(self, step: Step) -> None:
        if step.lens is not None:
            self.rec.lens_depths[step.index] = lens_depth(step.lens)
            self.rec.lens_layers = len(step.lens)
            self.changed = True

    def on_done(self) -> None:
        self.changed = True

    @property
    def status(self) -> str:
        """One line for the legend: the progress, or why it stopped."""
        have = sum(1 for i in range(self.total) if i in self.rec.lens_depths)
        if self.note:
            return self.note
        if have >= self.total:
            return ""
        if self.done:
            return f"reply {self.rec.number} stopped at {have}/{self.total} (Shift+F7 twice goes on)"
        return f"reading reply {self.rec.number}: {have}/{self.total} …"


def depth_request(backend: Any, rec: ReplyRecord | None) -> tuple[ReplyRequest, int] | None:
    """The run that reads `rec`'s passes not yet read with the lens, and how many tokens
    the reply has (None: every depth is known; Refused: it cannot be read)."""
    if not backend.can_branch:
        raise Refused(NO_LENS_ON_SERVER)
    if rec is None or not rec.done or rec.start is None:
        raise Refused("No finished reply to colour yet: the lens depth reads a finished reply's passes")
    check_same_model(backend, rec, "its lens depths")
    tokens: list[int] = []
    for i, step in enumerate(rec.steps):
        if step.is_stop:
            break
        if step.token_id is None or step.index != i:
            raise Refused("That reply's steps are not all in its record: its passes cannot be read again")
        tokens.append(int(step.token_id))
    first = next((i for i in range(len(tokens)) if i not in rec.lens_depths), None)
    if first is None:
        return None
    request = ReplyRequest(
        rec.messages,
        rec.start.settings.replace(max_tokens=len(tokens)),
        reply_prefix=tuple(tokens[:first]),
        forced=tuple(tokens[first:]),
        lens=True,
        report_k=1,
    )
    return request, len(tokens)
