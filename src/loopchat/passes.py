"""More than one token per forward pass (issue 25): which pass gave a step, and what it checked.

Speculative decoding guesses a few tokens cheaply (a draft: prompt lookup or a smaller
model), then one forward pass of the model evaluates them all at once, with logits at each
position. At each position the verifying pass draws a token exactly as the plain loop does
(the same sampler chain, the same seeded draw) from the logits at that position; a drafted
token is kept when that draw equals it (for a draft that proposes one token, the
speculative-sampling rule min(1, p/q) is exactly this), and the first disagreement ends the
pass: the drawn token is kept instead and the drafts after it are dropped. If every draft
is kept, the last position's logits give one more token of the pass's own.

A plain step has `Step.pass_report` None. Every step a verifying pass gave carries the same
`PassReport`; the step's `drafted` says whether its token was the draft's guess, kept, and
`rejected` names the draft's guess that its draw refused (docs/trace-format.md, "Passes").
"""

from __future__ import annotations

from typing import Any, NamedTuple

#: where drafted tokens come from ("off": the plain loop, one token per pass)
DRAFT_SOURCES = ("off", "lookup", "model")


class PassReport(NamedTuple):
    """One forward pass that checked drafted tokens; shared by every step it gave."""

    number: int  # the reply's pass number: 0 the prefill, then 1, 2, ... one per llama_decode of the reply
    drafted: int  # drafted tokens this pass checked (its batch held drafted + 1 positions)
    kept: int  # of them, kept: the pass's draws agreed with the first `kept` drafts
    drawn: bool  # the pass also gave a token of its own (after a rejection, or after every draft was kept)
    source: str  # "lookup" | "model" | "prediction" (a served request's predicted output): what drafted them
    ms: float  # wall time of the verifying llama_decode
    draft_ms: float  # wall time spent drafting for this pass (lookup search, or the draft model's passes)

    @property
    def tokens(self) -> int:
        """Tokens this pass gave to the reply."""
        return self.kept + int(self.drawn)


class RejectedDraft(NamedTuple):
    """The draft's guess at a position where the verifying pass drew another token."""

    token_id: int
    text: str
    raw_prob: float  # its probability in the raw softmax at that position
    sampled_prob: float  # its probability in the distribution the draw used (0: the settings cut it)


def pass_report(value: Any) -> PassReport:
    """A PassReport from its JSON form (a list in field order, as `event_json` writes a NamedTuple)."""
    number, drafted, kept, drawn, source, ms, draft_ms = value
    return PassReport(int(number), int(drafted), int(kept), bool(drawn), str(source), float(ms), float(draft_ms))
