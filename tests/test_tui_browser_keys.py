"""The second keys for a browser tab (`loopchat web`), where the browser keeps Ctrl+T,
Ctrl+N, Ctrl+W, F5, F11 and F12 for itself: each pressed in the app, its effect checked
(F1's "In a browser" column and docs/keys.md's third column list them). And Ctrl+Y in a
browser tab: it copies where the browser lets the page write its clipboard, and says it
cannot elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from textual import events
from tui_fixtures import fake_app, model_app, panel_text, record_notices, reply_to, wait_for, wait_run

from loopchat.browser import WEB_URL_ENV
from loopchat.tui.help_screen import IN_A_BROWSER, KEYS

ROOT = Path(__file__).parent.parent


async def alt(pilot, letter: str) -> None:
    """Alt+letter as a terminal or xterm.js sends it (Esc, then the letter): Textual reads
    the key "alt+n" with the character "n" (Pilot's press() gives no character)."""
    pilot.app.post_message(events.Key(f"alt+{letter}", letter))
    await pilot.pause()


KEYS_DOC = ROOT / "docs" / "keys.md"


def _third_column(text: str) -> dict[str, str]:
    """docs/keys.md's key table: key -> its "In a browser" cell, where there is one."""
    lines = text.split("## Keys", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Key |"))
    assert lines[start].split("|")[3].strip() == "In a browser"
    cells = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        key, _, browser = (cell.strip() for cell in line.split("|")[1:4])
        if browser:
            cells[key] = browser
    return cells


def test_the_key_docs_browser_column_is_f1s() -> None:
    assert _third_column(KEYS_DOC.read_text(encoding="utf-8")) == IN_A_BROWSER
    keys = {key for key, _ in KEYS}
    assert set(IN_A_BROWSER) <= keys  # each is a row of F1's list
    assert {"Ctrl+T", "Ctrl+N", "F5", "F12"} <= set(IN_A_BROWSER)


async def test_f1_has_the_browser_column_in_a_browser_tab_only(tmp_path, monkeypatch) -> None:
    """In a terminal the column took a sixth of an 80-column screen for six rows; a tab needs it."""
    from textual.widgets import Static

    from loopchat.tui.help_screen import HelpScreen

    for url in (None, "http://127.0.0.1:8000"):
        if url is None:
            monkeypatch.delenv(WEB_URL_ENV, raising=False)
        else:
            monkeypatch.setenv(WEB_URL_ENV, url)
        app = fake_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("f1")
            await wait_for(pilot, lambda a=app: isinstance(a.screen, HelpScreen), 5, "the keys")
            table = app.screen.query_one("#help-keys", Static).content
            assert len(table.columns) == (2 if url is None else 3)
            foot = str(app.screen.query_one("#help-foot", Static).content)
            assert ("the last column gives" in foot) == (url is not None)


async def test_alt_t_opens_and_closes_the_document_view(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(WEB_URL_ENV, "http://127.0.0.1:8000")  # a browser tab's chat
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "hello")
        await alt(pilot, "t")
        await wait_for(pilot, lambda: bool(app.document.display), 5, "the document view")
        assert not app.transcript.display
        head = "\n".join("".join(text for text, _ in line) for line in app.document.head.lines)
        assert "Alt+T: back" in head and "Ctrl+T" not in head  # its hint names the key that works
        await alt(pilot, "t")
        await wait_for(pilot, lambda: bool(app.transcript.display), 5, "the transcript")
        assert not app.document.display


async def test_alt_n_starts_a_new_conversation(tmp_path) -> None:
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "hello")
        assert app.conversation.replies
        await alt(pilot, "n")
        await wait_for(pilot, lambda: not app.conversation.replies, 5, "a new conversation")
        assert app.conversation.turns == [] and app.prompt.value == ""  # (no "n" typed in the box)
        assert not app.transcript.blocks


async def test_alt_r_regenerates_the_last_reply(tmp_path) -> None:
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "Say hi.")
        await alt(pilot, "r")
        await wait_for(pilot, lambda: len(app.conversation.replies) == 2, 5, "the second reply")
        await wait_run(pilot)
        assert app.prompt.value == ""
        first, second = app.conversation.replies
        assert first.replaced_by == 2 and second.messages == first.messages
        (view,) = app.transcript.reply_views()
        assert view.record is second and "version 2/2" in view.line(1).text


async def test_alt_backspace_deletes_a_word_in_the_message_box(tmp_path) -> None:
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press(*"hello big world")
        await pilot.press("alt+backspace")
        assert app.prompt.value == "hello big "


@pytest.mark.model
async def test_alt_s_arms_step_mode_and_runs_freely_again(live_backend, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(WEB_URL_ENV, "http://127.0.0.1:8000")  # a browser tab's chat
    app = model_app(live_backend, tmp_path, seed=42, max_tokens=20, temperature=0.8)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await alt(pilot, "s")
        assert app.session.step_armed and app.step_bar.display
        assert "(Alt+S disarms)" in str(app.step_bar.render())  # the hints name the key that works
        await pilot.press(*"Name a fruit.", "enter")
        s = app.session
        await wait_for(pilot, lambda: s.stopped and s.pending.index == 0, 30, "stopped before the first draw")
        assert app.current.steps == []
        assert "Alt+S runs freely" in str(app.step_bar.render()) and "F12" not in str(app.step_bar.render())
        assert "Alt+S runs" in panel_text(app)
        await alt(pilot, "s")  # run freely to the end
        await wait_run(pilot)
        assert app.current.steps and not s.stopped


@pytest.mark.parametrize(
    ("page", "copied"),
    [("http://127.0.0.1:8000", True), ("https://example.org/loopchat", True), ("http://192.168.1.20:8000", False)],
)
async def test_ctrl_y_in_a_browser_tab_copies_or_says_it_cannot(tmp_path, monkeypatch, page, copied) -> None:
    monkeypatch.setenv(WEB_URL_ENV, page)
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        seen = record_notices(app)
        await reply_to(pilot, "hello")
        await pilot.press("ctrl+y")
        await wait_for(pilot, lambda: bool(seen), 5, "a notice")
        if copied:
            assert app.clipboard and seen[-1].endswith("to the browser's clipboard")
        else:
            assert app.clipboard == ""
            assert seen[-1].startswith("Cannot copy here: browsers give their clipboard to https:// pages")
            assert page in seen[-1]


def test_in_a_browser_tab_the_footer_shows_the_browsers_key_first() -> None:
    """keys.py reads the page's URL when it loads: in a tab's process the second key comes
    first, so the footer (which shows a binding's first key) shows the one that works."""
    code = (
        "from loopchat.tui.keys import BINDINGS\n"
        "print(' '.join(b.key for b in BINDINGS if b.action in ('toggle_document', 'step_mode', 'regenerate', "
        "'new_conversation')))"
    )
    env = {k: v for k, v in os.environ.items() if k != WEB_URL_ENV}
    plain = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    tab = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, WEB_URL_ENV: "http://127.0.0.1:8000"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plain.stdout.split() == ["f5,alt+r", "ctrl+t,alt+t", "f12,alt+s", "ctrl+n,alt+n"]
    assert tab.stdout.split() == ["alt+r,f5", "alt+t,ctrl+t", "alt+s,f12", "alt+n,ctrl+n"]
