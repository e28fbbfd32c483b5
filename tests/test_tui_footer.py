"""The footer shows each key whole or not at all (it showed "f5 Regener" at 80 columns)."""

from __future__ import annotations

from tui_fixtures import fake_app, wait_for


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
        assert "Regenerate" in footer_state(app)[0]
        await pilot.resize_terminal(100, 30)
        await wait_for(pilot, lambda: footer_state(app)[1] and "Regenerate" in footer_state(app)[0], 5, "the keys at 100")
        assert "New" not in footer_state(app)[0]
