"""The loop panel at every height, in every mode, is what the five-step shrink-to-fit
ladder gave before `fit()` replaced it: tests/data/panel_ladder.json was recorded from
that code (tests/panel_ladder_cases.py), styles included. No Textual here."""

from __future__ import annotations

import pytest
from panel_ladder_cases import CASES, encode, expected


@pytest.mark.parametrize("name", list(CASES))
def test_every_height_draws_what_the_ladder_drew(name: str) -> None:
    from loopchat.chat.views.panel import panel_lines

    want = expected(name)
    assert len(want) > 10
    for height, lines in want.items():
        got = encode(panel_lines(CASES[name](height)))
        assert got == lines, (name, height)
