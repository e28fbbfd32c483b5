"""The loop panel's waterfall: what each stage of the sampler did at the pass shown (the
Step's stage reports, docs/trace-format.md "Sampler stages"), one row per stage in the
order they ran, then the draw (panel.py's `_drawn` follows it).

A row: the stage (with its setting), the candidates it left, the probability mass it
removed, the most likely token it removed with its probability. A stage that changes
logits says how many it changed and the mass it moved; one that did nothing says so.
The masses are shares of one distribution, so the rows add up: each row's kept mass is 1
minus the masses removed above it and by it. A step without reports (a server that is
not loopchat, an older trace) shows no waterfall.
"""

from __future__ import annotations

from loopchat.chat.plots import fmt_prob, token_face
from loopchat.chat.views.lines import Line, Pieces, fit_lines
from loopchat.chat.views.panel_view import DIM, DRAWN, HEAD, LABEL, NONE, TOKEN
from loopchat.events import Pending, Step
from loopchat.settings import SamplingSettings
from loopchat.stage_report import StageReport

#: a stage's name on screen, and its setting's value beside it
_NAMES = {
    "repeat_penalty": ("repeat", lambda s: f"×{s.repeat_penalty:g}"),
    "frequency_presence": ("freq/pres", None),  # (their values: the settings' line, "freq 0.50 pres 0.60")
    "dry": ("DRY", lambda s: f"×{s.dry_multiplier:g}"),
    "logit_bias": ("bias", lambda s: f"{len(s.logit_bias)} tok"),
    "top_k": ("top-k", lambda s: f"{s.top_k}" if s.top_k else "off"),
    "top_p": ("top-p", lambda s: f"{s.top_p:g}"),
    "min_p": ("min-p", lambda s: f"{s.min_p:g}"),
    "temperature": ("temp", lambda s: f"{s.temperature:g}"),
    "greedy": ("greedy", lambda s: "T 0"),
}
_LABEL_W = 14
_KEPT_W, _REMOVED_W = 7, 7
#: the most likely cut token's cells at most
_FACE_W = 10


def stage_label(r: StageReport, s: SamplingSettings) -> str:
    name, value = _NAMES.get(r.stage, (r.stage.replace("_", " "), None))
    return f"{name} {value(s)}" if value is not None else name


def _row(r: StageReport, s: SamplingSettings) -> Pieces:
    label: Pieces = [(f"{stage_label(r, s)[: _LABEL_W - 1]:<{_LABEL_W - 1}} ", LABEL)]
    if r.removed:
        row = label + [(f"{r.kept:>{_KEPT_W},} {fmt_prob(r.removed_mass):>{_REMOVED_W}}", NONE)]
        if r.cut_id >= 0:
            face = token_face(r.cut_text) if r.cut_text else f"#{r.cut_id}"
            face = face if len(face) <= _FACE_W else face[: _FACE_W - 1] + "…"
            row += [("  ", NONE), (face, TOKEN), (f" {fmt_prob(r.cut_prob)}", NONE)]
        return row
    if r.changed:
        n = f"{r.changed} logit{'s' if r.changed != 1 else ''}"
        return label + [(f"changed {n} · moved {fmt_prob(r.moved_mass)}", NONE)]
    if r.stage == "temperature" and s.temperature != 1.0:
        return label + [(f"divides the logits by {s.temperature:g}", NONE)]
    return label + [("did nothing", DIM)]


def waterfall_lines(step: Step | Pending | None, width: int) -> list[Line]:
    """The waterfall's lines (a head, one row per stage); [] when the step has no reports
    (a Pending's: the draw the loop is stopped before, in step mode)."""
    if step is None or not step.stages:
        return []
    head: Pieces = [("Sampler, stage by stage", HEAD), (f" · {step.stages[-1].kept:,} left", LABEL)]
    columns: Pieces = [(f"{'':<{_LABEL_W}}{'kept':>{_KEPT_W}} {'removed':>{_REMOVED_W}}  most likely cut", LABEL)]
    return fit_lines([head, columns, *(_row(r, step.settings) for r in step.stages)], width, no_wrap=True)


def waterfall_short(step: Step | Pending | None, width: int) -> list[Line]:
    """The waterfall in one line, for a short panel: the stages that removed candidates."""
    if step is None or not step.stages:
        return []
    cut = [r for r in step.stages if r.removed]
    total = sum(r.removed_mass for r in cut)
    what = ", ".join(f"{stage_label(r, step.settings).split(' ')[0]} −{fmt_prob(r.removed_mass)}" for r in cut)
    line: Pieces = [("sampler ", LABEL), (what or "removed nothing", NONE)]
    if len(cut) > 1 and len("sampler ") + len(what) + len(f" = −{fmt_prob(total)}") <= width:
        line.append((f" = −{fmt_prob(total)}", DRAWN))  # (the sum goes first on a narrow panel)
    return fit_lines([line], width, no_wrap=True)
