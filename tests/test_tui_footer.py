"""The footer shows each key whole or not at all (it showed "f5 Regener" at 80 columns)."""

from __future__ import annotations

import pytest
from tui_fixtures import fake_app, palette_pick, wait_for


def footer_state(app):
    """(the shown items' descriptions, whether every shown one ends before the palette's key)."""
    footer = app.query_one("Footer")
    palette = next((c for c in footer.children if c.has_class("-command-palette")), None)
    if palette is None or not palette.region.width:  # not composed and laid out yet
        return [], False
    shown = [c for c in footer.children if c.display and c is not palette]
    whole = all(c.region.width and c.region.right <= palette.region.x for c in shown)
    return [getattr(c, "description", "") for c in shown if getattr(c, "description", "")], whole


async def test_the_footer_leaves_out_keys_it_would_cut_and_shows_them_when_wide(tmp_path) -> None:
    app = fake_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: footer_state(app)[1], 5, "the footer's keys whole at 80 columns")
        names, _ = footer_state(app)
        assert names[:2] == ["Quit", "Keys"] and "Settings" in names and "Regenerate" not in names, names
        await pilot.resize_terminal(120, 40)
        await wait_for(pilot, lambda: "New" in footer_state(app)[0] and footer_state(app)[1], 5, "all the keys at 120")
        await pilot.resize_terminal(100, 30)
        await wait_for(
            pilot,
            lambda: footer_state(app)[1] and "Regenerate" in footer_state(app)[0] and "New" not in footer_state(app)[0],
            5,
            "the keys that fit at 100",
        )


@pytest.mark.slow
async def test_the_footer_still_fits_after_a_palette_command_and_the_keys_list(tmp_path) -> None:
    """The footer's keys are made again when a screen closes: after a command picked in
    the palette they were all shown, the last one cut ("f5 Regener")."""
    app = fake_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: footer_state(app)[1], 5, "the footer's keys whole")
        await palette_pick(pilot, "Token boundaries")
        await wait_for(pilot, lambda: app.screen is app.screen_stack[0], 5, "the palette closed")
        await wait_for(pilot, lambda: footer_state(app)[1], 5, "the footer's keys whole after the palette")
        assert "Regenerate" not in footer_state(app)[0]
        await pilot.press("f1")
        await wait_for(pilot, lambda: app.screen is not app.screen_stack[0], 5, "the keys list")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is app.screen_stack[0], 5, "the keys list closed")
        await wait_for(pilot, lambda: footer_state(app)[1], 5, "the footer's keys whole after F1")
