"""The loop panel's rows for a reply under a constraint (a grammar or a JSON schema, issue 24):
what the constraint did at the pass shown (Step.constraint, docs/trace-format.md "The
constraint"), and the reply's info-line phrase (forced passes, forbidden mass in all).

    constraint  162 of 49,152 tokens allowed
    forbidden   1.55% of the raw mass
    wanted      ' ```' 60.3% raw (forbidden)
    forced      the model had no say

Nothing for a step without one (an unconstrained reply, a server that does not send it).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.style import Style

from loopchat.chat.plots import fmt_prob, token_face
from loopchat.chat.views.panel_view import LABEL, NONE, TOKEN
from loopchat.constraint import reply_summary
from loopchat.events import Finish, Step

#: a forced pass (the panel's mark, and the transcript's when forced tokens are marked)
FORCED = Style.parse("bold #87afff")
FORBIDDEN = Style.parse("#ff8787")

Pieces = list[tuple[str, Style]]


def constraint_lines(step: Step, n_vocab: int | None) -> list[Pieces]:
    """The rows for the pass `step` records (none without a constraint report)."""
    r = step.constraint
    if r is None:
        return []
    of = f" of {n_vocab:,}" if n_vocab else ""
    out: list[Pieces] = [
        [("constraint  ", LABEL), (f"{r.allowed:,}{of} tokens allowed", NONE)],
        [("forbidden   ", LABEL), (f"{fmt_prob(r.forbidden_mass)} of the raw mass", NONE)],
    ]
    if r.top_forbidden_id >= 0:
        out.append(
            [
                ("wanted      ", LABEL),
                (token_face(r.top_forbidden_text, None), TOKEN),
                (f" {fmt_prob(r.top_forbidden_prob)} raw", NONE),
                (" (forbidden)", FORBIDDEN),
            ]
        )
    if r.forced:
        out.append([("forced      ", LABEL), ("the model had no say", FORCED)])
    return out


def constraint_part(steps: Sequence[Step], finish: Finish | None) -> str | None:
    """The reply's info-line phrase: forced passes and the forbidden mass summed over its
    passes, and a cut before the structure closed (None: no constraint)."""
    reports = [s.constraint for s in steps if s.constraint is not None]
    if not reports:
        return None
    text = reply_summary("constraint", reports)
    if finish is not None and finish.constraint_closed is False:
        text += " · cut before its structure closed"
    return text
