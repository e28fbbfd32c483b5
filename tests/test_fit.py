"""`fit(sections, height)`: sections give way in order of priority, the forms of one
priority together, and only as far as the height needs. No Textual, no model."""

from __future__ import annotations

import subprocess
import sys

from rich.style import Style

from loopchat.chat.views.fit import FULL, Form, Section, fit
from loopchat.chat.views.lines import Line


def lines(name: str, n: int) -> list[Line]:
    return [((f"{name}{i}", Style()),) for i in range(n)]


def names(out: list[Line]) -> list[str]:
    return [line[0][0] for line in out]


def test_nothing_gives_way_when_the_lines_fit_or_the_height_is_no_limit() -> None:
    sections = [Section(lines("a", 3), (Form(1, ()),)), Section(lines("b", 2), (Form(2, lines("s", 1)),))]
    whole = ["a0", "a1", "a2", "b0", "b1"]
    for height in (0, -1, 5, 6, 100):
        assert names(fit(sections, height)) == whole


def test_the_lowest_priority_gives_way_first_and_no_further_than_needed() -> None:
    sections = [
        Section(lines("head", 1)),
        Section(lines("keys", 2), (Form(1, ()),)),
        Section(lines("body", 3), (Form(2, lines("short", 1)),)),
    ]
    assert names(fit(sections, 4)) == ["head0", "body0", "body1", "body2"]  # the keys went, the body is whole
    assert names(fit(sections, 3)) == ["head0", "short0"]  # then the body's short form
    assert names(fit(sections, 1)) == ["head0", "short0"]  # past the last form: the screen cuts the end


def test_the_forms_of_one_priority_are_taken_together() -> None:
    sections = [Section(lines("a", 2), (Form(1, ()),)), Section(lines("b", 2), (Form(1, ()),)), Section(lines("c", 1))]
    assert names(fit(sections, 4)) == ["c0"]  # both went at once, though one would have done


def test_a_form_that_is_a_function_gets_the_lines_still_over() -> None:
    asked: list[int] = []

    def table(over: int) -> list[Line]:
        asked.append(over)
        return lines("row", max(3, 10 - over))

    sections = [Section(lines("head", 2), (Form(1, lines("h", 1)),)), Section(lines("row", 10), (Form(2, table),))]
    assert names(fit(sections, 9)) == ["h0", *[f"row{i}" for i in range(8)]]
    assert asked == [2]  # 11 lines once the head was short, for 9
    assert len(fit(sections, 2)) == 4  # never fewer than the function's 3 rows


def test_a_section_comes_back_when_another_takes_its_short_form_and_can_go_again() -> None:
    """Step mode's keys: they go before the settings; once the settings are on one line
    the keys come back if there is room, and are the first to go again."""
    sections = [
        Section(lines("keys", 1), (Form(1, ()), Form(2, FULL), Form(3, ())), name="keys"),
        Section(lines("settings", 6), (Form(2, lines("one", 1)),), name="settings"),
        Section(lines("rows", 4), (Form(4, lines("row", 3)),), name="rows"),
    ]
    assert names(fit(sections, 10)) == names(fit(sections, 0))[1:]  # the keys went
    assert names(fit(sections, 6)) == ["keys0", "one0", "rows0", "rows1", "rows2", "rows3"]  # and came back
    assert names(fit(sections, 5)) == ["one0", "rows0", "rows1", "rows2", "rows3"]  # and went again
    assert names(fit(sections, 4)) == ["one0", "row0", "row1", "row2"]


def test_the_views_models_import_no_textual_and_nothing_from_tui() -> None:
    code = (
        "import sys\n"
        "import loopchat.chat.views.panel, loopchat.chat.views.document, loopchat.chat.views.document_header\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'textual' or m.startswith('loopchat.tui'))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
