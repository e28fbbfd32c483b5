"""The loop panel's pass rows: a step that a verifying pass gave (speculative decoding,
passes.py) says which pass it was, what that pass checked and kept, how long it took,
what this token's role in it was, and the drafts it refused.

    pass 37 · checked 5 drafted tokens · kept 3 + 1 drawn · 14.2 ms
    this token: drafted, kept
    refused at token 15: ' the' · raw 12.0% · after sampling 9.1%
    drafted by prompt lookup in 0.3 ms · this pass gave tokens 12–15

or, for the token drawn after the refusal, its role says it:

    this token: drawn by the pass after the draft's ' the' (12.0% raw, 9.1% after sampling) was refused

A plain step (`pass_report` None) has no pass rows: nothing changes for it. On a short
panel the draft's source row goes with the sampler's waterfall, the others after the
candidates shrank, from the last, then the pass row becomes one line (`pass_short`). Every figure is a field of the step's PassReport or RejectedDraft
(docs/trace-format.md, "Passes").
"""

from __future__ import annotations

from collections.abc import Sequence

from loopchat.chat.pass_stats import SOURCES, pass_row, pass_steps, role
from loopchat.chat.plots import fmt_ms, fmt_prob, token_face
from loopchat.chat.views.lines import Line, Pieces, fit_lines
from loopchat.chat.views.panel_view import DRAWN, LABEL, NONE, TOKEN
from loopchat.events import Step
from loopchat.passes import RejectedDraft


def _span(steps: Sequence[Step]) -> str:
    first, last = steps[0].index + 1, steps[-1].index + 1
    return f"token {first}" if first == last else f"tokens {first}–{last}"


def rejected_line(at: Step, r: RejectedDraft) -> Pieces:
    """A refused draft: where, what, and the model's raw and sampled probability for it."""
    sampled = fmt_prob(r.sampled_prob) if r.sampled_prob > 0 else "cut by sampling"
    return [
        (f"refused at token {at.index + 1}: ", LABEL),
        (token_face(r.text), TOKEN),
        (f" · raw {fmt_prob(r.raw_prob)} · after sampling {sampled}", NONE),
    ]


def pass_lines(step: Step | None, steps: Sequence[Step], width: int, over: int = 0, source: bool = True) -> list[Line]:
    """The pass rows of `step` (one of the reply's `steps`); [] for a plain step. `over`:
    lines to give up (a short panel): the rows go from the last (the draft's source, the
    refused draft, the token's role), then the pass row becomes `pass_short`'s line;
    `source` False: without the draft's source row (what a short panel gives up first)."""
    if step is None or (p := step.pass_report) is None:
        return []
    gave = pass_steps(steps, step)
    drafter = SOURCES.get(p.source, p.source)
    rows: list[Pieces] = [[(pass_row(p), DRAWN)], [("this token: ", LABEL), (role(step, sampled=True), NONE)]]
    # the drafts the pass refused (at most one: the first refusal ends the pass), unless this token's draw did
    rows += [rejected_line(s, s.rejected) for s in gave if s.rejected is not None and s is not step]
    if source:
        rows.append([(f"drafted by {drafter} in {fmt_ms(p.draft_ms)} · this pass gave {_span(gave)}", LABEL)])
    fitted = [fit_lines([row], width) for row in rows]
    while over > 0 and len(fitted) > 1:
        over -= len(fitted.pop())
    if over > 0:
        return pass_short(step, width)
    return [line for lines in fitted for line in lines]


def pass_short(step: Step | None, width: int) -> list[Line]:
    """The pass rows in one line, for a short panel: 'pass 37 · kept 3 of 5 + 1 drawn · this: drawn'
    (this token: the draft's, kept; or drawn by the pass); narrower: 'pass 37 · kept 3/5 + 1 · this: drawn'."""
    if step is None or (p := step.pass_report) is None:
        return []
    drawn = " + 1 drawn" if p.drawn else ""
    this = f" · this: {'kept' if step.drafted else 'drawn'}"
    text = f"pass {p.number + 1} · kept {p.kept} of {p.drafted}{drawn}{this}"
    if len(text) > width:
        text = f"pass {p.number + 1} · kept {p.kept}/{p.drafted}{' + 1' if p.drawn else ''}{this}"
    return fit_lines([[(text, DRAWN)]], width, no_wrap=True)
