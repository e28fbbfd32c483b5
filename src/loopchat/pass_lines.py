"""Speculative passes as text (passes.py): a verifying pass's line, and a reply's figures
(`loopchat run --show-passes` and its summary; docs/trace-format.md, "Passes").

A reply's passes: each step without a `pass_report` is a plain pass of its own (one token);
the steps sharing a `pass_report` (by its number) are one verifying pass. Tokens per pass =
the reply's steps / those passes; the acceptance = the drafts kept / the drafts checked,
summed over the verifying passes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from loopchat.events import Step
from loopchat.passes import PassReport


def pass_line(report: PassReport) -> str:
    """'pass 37 · checked 5 drafted tokens · kept 3 + 1 drawn · 14.2 ms (draft 0.1 ms)'."""
    checked = f"checked {report.drafted} drafted token{'s' if report.drafted != 1 else ''}"
    kept = f"kept {report.kept}" + (" + 1 drawn" if report.drawn else "")
    return f"pass {report.number} · {checked} · {kept} · {report.ms:.1f} ms (draft {report.draft_ms:.1f} ms)"


class PassFigures(NamedTuple):
    tokens: int  # the reply's steps
    passes: int  # the forward passes that gave them (plain and verifying)
    verifying: int  # of them, verifying passes
    drafted: int  # drafts checked
    kept: int  # drafts kept

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.passes if self.passes else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.kept / self.drafted if self.drafted else None


def pass_figures(steps: Iterable[Step]) -> PassFigures:
    tokens = plain = 0
    reports: dict[int, PassReport] = {}
    for step in steps:
        tokens += 1
        if step.pass_report is None:
            plain += 1
        else:
            reports[step.pass_report.number] = step.pass_report
    drafted = sum(r.drafted for r in reports.values())
    kept = sum(r.kept for r in reports.values())
    return PassFigures(tokens, plain + len(reports), len(reports), drafted, kept)


def draft_summary(figures: PassFigures) -> str:
    """The run's draft line: '212 tok in 61 passes (3.48 tok/pass) · 40 verifying · kept 160 of
    185 drafted (86%)'."""
    accepted = figures.acceptance
    rate = f" ({100 * accepted:.0f}%)" if accepted is not None else ""
    return (
        f"{figures.tokens} tok in {figures.passes} passes ({figures.tokens_per_pass:.2f} tok/pass) · "
        f"{figures.verifying} verifying · kept {figures.kept} of {figures.drafted} drafted{rate}"
    )
