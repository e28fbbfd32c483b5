"""The command palette's Keys and Screenshot entries (Textual's own, made loopchat's), and its Draft entries."""

from __future__ import annotations

import pytest
from textual.widgets import HelpPanel
from tui_fixtures import fake_app, palette_pick, record_notices, wait_for

from loopchat.settings import SETTING
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


def test_the_palettes_draft_entries_follow_the_settings_draft_row() -> None:
    """One entry per draft source, the one in force marked; none without a `draft` row."""
    from loopchat.tui.keys import command_table, draft_entries

    assert draft_entries(None) == []
    entries = draft_entries("lookup")
    assert [title for title, _, _ in entries] == ["Draft: off", "Draft: lookup (current)", "Draft: model"]
    assert [action for _, _, action in entries] == ["set_draft('off')", "set_draft('lookup')", "set_draft('model')"]
    table = command_table(completion=False, completion_space=True, history=True, draft="off")
    assert [t for t, _, _ in table if t.startswith("Draft:")] == [
        "Draft: off (current)",
        "Draft: lookup",
        "Draft: model",
    ]


@pytest.mark.slow
@pytest.mark.skipif(
    "draft" not in SETTING, reason="the settings table has no `draft` row yet (issue 25's engine adds it)"
)
async def test_the_palettes_draft_entry_sets_the_draft_as_f2_does(tmp_path) -> None:
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        notices = record_notices(app)
        assert app.session.settings.draft == "off"
        await palette_pick(pilot, "Draft: lookup")
        await wait_for(pilot, lambda: app.session.settings.draft == "lookup", 10, "the draft set")
        await wait_for(pilot, lambda: any(n.startswith("Draft: lookup") for n in notices), 10, "the notice")
        titles = [c.title for c in app.key_commands() if c.title.startswith("Draft:")]
        assert titles == ["Draft: off", "Draft: lookup (current)", "Draft: model"]
