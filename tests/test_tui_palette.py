"""The command palette's Keys and Screenshot entries (Textual's own, made loopchat's)."""

from __future__ import annotations

import pytest
from textual.widgets import HelpPanel
from tui_fixtures import fake_app, palette_pick, record_notices, wait_for

from loopchat.tui.help_screen import HelpScreen


@pytest.mark.slow
async def test_the_palettes_keys_opens_f1s_list_and_esc_closes_it(tmp_path) -> None:
    """It opened Textual's generic key panel (not F1's list), and Esc did not close it."""
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await palette_pick(pilot, "Keys")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), 5, "F1's list of keys")
        assert not app.screen.query(HelpPanel) and not app.screen_stack[0].query(HelpPanel)
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is app.screen_stack[0], 5, "the list closed")
        assert not app.screen.query(HelpPanel)


async def test_a_screenshot_without_a_downloads_folder_goes_to_the_data_folder(tmp_path, monkeypatch) -> None:
    """It said only "Failed to save screenshot" when ~/Downloads was missing."""
    downloads = tmp_path / "no-downloads"
    data = tmp_path / "data"
    monkeypatch.setenv("XDG_DOWNLOAD_DIR", str(downloads))
    monkeypatch.setenv("LOOPCHAT_DATA_DIR", str(data))
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        notices = record_notices(app)
        await palette_pick(pilot, "Screenshot")
        await wait_for(pilot, lambda: any("screenshot" in n.lower() for n in notices), 10, "the screenshot's notice")
        await wait_for(pilot, lambda: data.is_dir() and list(data.glob("*.svg")), 10, "the file")
        (svg,) = data.glob("*.svg")
        assert any(str(svg) in n for n in notices), notices
        assert "<svg" in svg.read_text()[:2000]
        assert not downloads.exists()


async def test_a_screenshot_goes_to_the_downloads_folder_where_there_is_one(tmp_path, monkeypatch) -> None:
    downloads = tmp_path / "Downloads"
    downloads.mkdir()
    monkeypatch.setenv("XDG_DOWNLOAD_DIR", str(downloads))
    monkeypatch.setenv("LOOPCHAT_DATA_DIR", str(tmp_path / "data"))
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        notices = record_notices(app)
        await palette_pick(pilot, "Screenshot")
        await wait_for(pilot, lambda: list(downloads.glob("*.svg")), 10, "the file")
        (svg,) = downloads.glob("*.svg")
        await wait_for(pilot, lambda: any(str(svg) in n for n in notices), 10, "the notice naming it")
