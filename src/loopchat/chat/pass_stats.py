"""A reply's forward passes under a draft (speculative decoding, passes.py): which steps
one pass gave, and the figures over the reply: tokens per pass and the acceptance rate.

A step with `pass_report` None came from a plain pass (one token: step 0's is the
prefill's); the steps a verifying pass gave are consecutive and share its PassReport.
Over a reply (docs/trace-format.md, "Passes"):

- tokens per pass = the reply's steps (the stop token included: a pass drew it too) /
  its passes (verifying passes + plain passes);
- acceptance = the drafted tokens kept / the drafted tokens checked, summed over the
  verifying passes.

Textual-free (the words of a pass: `pass_row`, `role`): the transcript's info line, the panel, the F6 grouping,
the document and the wire views read it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from loopchat.chat.plots import fmt_ms, fmt_prob, token_face
from loopchat.events import Step
from loopchat.pass_lines import PassFigures, pass_figures
from loopchat.passes import PassReport, RejectedDraft


def same_pass(a: Step | None, b: Step | None) -> bool:
    """Whether steps `a` and `b` (consecutive in a reply) came from one verifying pass."""
    if a is None or b is None or a.pass_report is None or b.pass_report is None:
        return False
    return a.pass_report.number == b.pass_report.number


def tally(steps: Sequence[Step]) -> PassFigures | None:
    """The figures over `steps` (one reply's, in order: pass_lines.pass_figures); None when no
    step came from a verifying pass (a reply without a draft)."""
    figures = pass_figures(steps)
    return figures if figures.verifying else None


def _position(steps: Sequence[Step], step: Step) -> int:
    """Where `step` is in `steps` (-1: not there)."""
    at = step.index - steps[0].index if steps else -1
    if 0 <= at < len(steps) and steps[at] is step:
        return at
    return next((i for i, s in enumerate(steps) if s is step), -1)


class _Verified:
    """Where a reply's steps from verifying passes are (positions, ascending), kept from
    one call to the next for the list last asked about and extended with its new steps
    only: the panel asks once a frame, and a frame must not cost the whole reply."""

    def __init__(self) -> None:
        self.steps: Sequence[Step] | None = None
        self.first: Step | None = None
        self.seen = 0
        self.at: list[int] = []

    def before(self, steps: Sequence[Step], at: int) -> int:
        """The position of the last step before `at` that a verifying pass gave (-1: none)."""
        if steps is not self.steps or len(steps) < self.seen or (steps and steps[0] is not self.first):
            self.steps, self.first, self.seen, self.at = steps, steps[0] if steps else None, 0, []
        for k in range(self.seen, len(steps)):
            if steps[k].pass_report is not None:
                self.at.append(k)
        self.seen = len(steps)
        i = bisect.bisect_left(self.at, at)
        return self.at[i - 1] if i else -1


_VERIFIED = _Verified()


def forward_pass(steps: Sequence[Step], step: Step) -> int:
    """The forward pass that gave `step` (one of `steps`, its reply's), counted from 1 (the
    prefill's) as the panel's title counts them: `pass_report.number + 1`; a plain step
    after a verifying pass: one more per step since that pass; with no draft, index + 1."""
    if step.pass_report is not None:
        return step.pass_report.number + 1
    at = _position(steps, step)
    k = _VERIFIED.before(steps, at) if at > 0 else -1
    if k < 0:
        return step.index + 1
    p = steps[k].pass_report
    assert p is not None
    return p.number + 1 + (at - k)


def pass_of_token(steps: Sequence[Step], index: int) -> str:
    """'pass N' for the step `index` of `steps` (its forward pass, `forward_pass`), or
    'token K, pass N' under a draft, where N is not index + 1."""
    step = next((s for s in steps if s.index == index), None)
    n = forward_pass(steps, step) if step is not None else index + 1
    return f"pass {n}" if n == index + 1 else f"token {index + 1}, pass {n}"


def pass_steps(steps: Sequence[Step], step: Step) -> list[Step]:
    """The steps of `steps` that the pass of `step` gave, in order ([step] for a plain
    pass, or a step not in `steps`)."""
    if step.pass_report is None or not steps:
        return [step]
    at = _position(steps, step)
    if at < 0:
        return [step]
    lo = at
    while lo > 0 and same_pass(steps[lo - 1], step):
        lo -= 1
    hi = at + 1
    while hi < len(steps) and same_pass(steps[hi], step):
        hi += 1
    return list(steps[lo:hi])


def reply_part(steps: Sequence[Step]) -> str | None:
    """The reply's info-line phrase: tokens per pass and the acceptance rate (None: no
    draft), e.g. '1.86 tokens a pass (41 in 22 passes) · drafts kept 25 of 41 (61%)'."""
    t = tally(steps)
    if t is None:
        return None
    text = f"{t.tokens_per_pass:.2f} tokens a pass ({t.tokens} in {t.passes} passes)"
    if t.acceptance is None:
        return text + " · nothing drafted"
    return text + f" · drafts kept {t.kept} of {t.drafted} ({t.acceptance * 100:.0f}%)"


#: what drafted the tokens, in running text
SOURCES = {"lookup": "prompt lookup", "model": "the draft model", "prediction": "the predicted output"}


def _tokens(n: int) -> str:
    return f"{n} drafted token{'s' if n != 1 else ''}"


def pass_row(p: PassReport) -> str:
    """'pass 37 · checked 5 drafted tokens · kept 3 + 1 drawn · 14.2 ms' (the pass counted from
    1, the prefill's, as the panel's title counts forward passes: `number + 1`)."""
    if p.drafted == 0:
        what = "no drafted tokens to check · " + ("1 drawn" if p.drawn else "nothing drawn")
    else:
        kept = f"kept {p.kept}" + (" + 1 drawn" if p.drawn else "")
        what = f"checked {_tokens(p.drafted)} · {kept}"
    return f"pass {p.number + 1} · {what} · {fmt_ms(p.ms)}"


def _refused(r: RejectedDraft, sampled: bool) -> str:
    after = ""
    if sampled:
        after = f", {fmt_prob(r.sampled_prob)} after sampling" if r.sampled_prob > 0 else ", cut by sampling"
    return f"the draft's {token_face(r.text)} ({fmt_prob(r.raw_prob)} raw{after}) was refused"


def role(step: Step, sampled: bool = False) -> str:
    """This token's part in its pass: 'drafted, kept', or drawn by the pass (and why; with
    `sampled`, the refused draft's probability after sampling too)."""
    p = step.pass_report
    if step.drafted:
        return "drafted, kept"
    if step.rejected is not None:
        return f"drawn by the pass after {_refused(step.rejected, sampled)}"
    if p is not None and p.drafted and p.kept == p.drafted:
        return f"drawn by the pass after all {_tokens(p.drafted)} were kept"
    return "drawn by the pass"
