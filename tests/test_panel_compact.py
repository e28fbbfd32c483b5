"""The compact loop panel (a narrow screen: the panel below the transcript, 8 lines): the
sampler's stages in one line and a forced pass's mark beside the top candidates, which give
way (down to 3) so the panel keeps its height. No Textual here; the chat's own narrow panel
on the real model is in test_tui_waterfall.py."""

from __future__ import annotations

import dataclasses

from panel_ladder_cases import reply

from loopchat.chat.views.lines import lines_to_text
from loopchat.chat.views.panel import panel_lines
from loopchat.chat.views.panel_view import PanelView
from loopchat.chat.views.panel_waterfall import waterfall_short
from loopchat.constraint import ConstraintReport
from loopchat.stage_report import StageReport

_STAGES = (
    StageReport("top_k", 49_112, 0.058, 40, 0.942, cut_id=7, cut_prob=0.01),
    StageReport("top_p", 33, 0.0924, 7, 0.8496, cut_id=8, cut_prob=0.004),
    StageReport("temperature", 0, 0.0, 7, 0.8496),
)


def _lines(step, height: int = 8) -> list[str]:
    r = reply(done=True)
    view = PanelView(record=r, step=step, live=step.settings, pinned=True, width=80, height=height, compact=True)
    return lines_to_text(panel_lines(view)).plain.splitlines()


def test_the_compact_panel_shows_the_sampler_in_one_line_within_its_height() -> None:
    plain = reply(done=True).steps[-1]
    before = _lines(plain)
    assert any(line.lstrip().startswith("top 5 ") for line in before) and not any("sampler" in x for x in before)
    step = dataclasses.replace(plain, stages=_STAGES)
    lines = _lines(step)
    assert len(lines) <= 8, lines
    # (38 cells: the stages' sum gives way before their masses)
    sampler = [line for line in lines if "sampler top-k −5.80%, top-p −9.24%" in line]
    assert len(sampler) == 1 and "= " not in sampler[0] and "…" not in sampler[0], lines
    # the title of a selected token takes two lines: the top 5 gave way to 4, the panel kept its height
    assert any(line.lstrip().startswith("top 4 ") for line in lines), lines
    wide = waterfall_short(step, 60)  # wider, the sum too
    assert "".join(t for t, _ in wide[0]) == "sampler top-k −5.80%, top-p −9.24% = −15.0%"


def test_a_forced_pass_is_marked_and_the_candidates_give_way() -> None:
    forced = ConstraintReport(1, 0.42, 5, " no", 0.3, True)
    step = dataclasses.replace(reply(done=True).steps[-1], stages=_STAGES, constraint=forced)
    lines = _lines(step)
    assert len(lines) <= 8, lines
    assert any("forced: the model had no say" in line for line in lines), lines
    assert any(line.lstrip().startswith("top 3 ") for line in lines), lines  # one more candidate gave way
    # a taller panel (no height given: as many lines as it needs) keeps the top 5
    assert any(line.lstrip().startswith("top 5 ") for line in _lines(step, height=0))
