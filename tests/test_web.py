"""`loopchat web` in a real browser: Debian's chromium, headless, driven by Playwright
(`make test` installs chromium where it can; without it these tests are skipped and say
why). Each test starts `loopchat web` on a free port with its own data folder, opens the
page, and reads the terminal's text from xterm.js's buffer (web_browser.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from web_browser import CHROMIUM, CHROMIUM_ARGS, HOOK, Web, open_tab, send, terminal_text, wait_text, wait_until

pytestmark = [
    pytest.mark.server,
    pytest.mark.model,  # each tab's chat loads the default model (in its own process)
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason=f"no {CHROMIUM}: loopchat web's browser tests need Debian's chromium (`make test` installs it as root)",
    ),
]

#: where test_a_reply_streams_and_alt_s_stops_the_loop saves its screenshot besides its
#: temporary folder (the README's: LOOPCHAT_WEB_SCREENSHOT=docs/web.png)
SCREENSHOT_ENV = "LOOPCHAT_WEB_SCREENSHOT"
VIEWPORT = {"width": 1280, "height": 720}


@pytest.fixture(scope="module")
def chromium():
    """One chromium for the module (a launch is ~1 s of CPU); each test has its own context."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser(chromium):
    """A fresh browser context per test (its own cookies, storage and permissions, as a
    fresh profile had), in the module's chromium."""
    context = chromium.new_context(viewport=VIEWPORT)
    context.add_init_script(HOOK)
    try:
        yield context
    finally:
        context.close()


@pytest.fixture
def web(tmp_path):
    server = Web(tmp_path / "home")
    try:
        yield server
    finally:
        assert server.stop() == 0, server.tail()


def ready(page) -> None:
    wait_text(page, "the model loaded", lambda text: "Enter sends" in text, 90)


def test_a_reply_streams_and_alt_s_stops_the_loop(web, browser, tmp_path) -> None:
    page = open_tab(browser, web.url)
    ready(page)
    # the footer shows the keys that work in a browser: the browser keeps F12 and Ctrl+T
    footer = terminal_text(page).rstrip().splitlines()[-1]
    assert "alt+s Step mode" in footer and "alt+t Document" in footer, footer
    send(page, "Name a fruit.")
    wait_text(page, "tokens and the loop panel's forward pass", lambda t: "Forward pass" in t, 60)
    wait_text(page, "the end of the reply", lambda t: " tok/s · " in t, 90)
    assert "Assistant · reply 1" in terminal_text(page)
    # Ctrl+Y: the reply reaches the browser's clipboard (xterm.js takes the chat's OSC 52)
    browser.grant_permissions(["clipboard-read", "clipboard-write"], origin=web.url)
    page.keyboard.press("Control+y")
    wait_text(page, "the copy's notice", lambda t: "Copied reply 1" in t, 30)  # (its line wraps where it may)
    copied = page.evaluate("() => navigator.clipboard.readText()")
    assert copied and copied.split()[0] in terminal_text(page), copied
    # Alt+S (F12 in a terminal): the next reply stops before its first draw, and stays so
    page.keyboard.press("Alt+s")
    send(page, "Name a colour.")
    wait_text(page, "the loop stopped", lambda t: "Stopped before the draw of token 1" in t, 60)
    text = terminal_text(page)
    assert "Step mode · stopped before token 1" in text and "Alt+S runs freely" in text and "F12" not in text
    page.keyboard.press("Enter")  # one draw: the loop goes one pass further and stops again
    wait_text(page, "the next stop", lambda t: "Stopped before the draw of token 2" in t, 60)
    shot = tmp_path / "web.png"
    page.screenshot(path=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get(SCREENSHOT_ENV):
        Path(os.environ[SCREENSHOT_ENV]).write_bytes(shot.read_bytes())
    page.keyboard.press("Alt+s")  # run freely to the end
    wait_text(page, "the second reply's end", lambda t: "· done: " in t and "Stopped before" not in t, 90)
    page.keyboard.press("Alt+n")  # a new conversation (Ctrl+N is the browser's new window)
    wait_text(page, "a new conversation", lambda t: "Assistant · reply" not in t, 30)


def _history(web: Web) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-m", "loopchat", "history", "list", "--json"],
        env=web.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_two_tabs_converse_at_once_and_both_are_in_the_history(web, browser) -> None:
    first = open_tab(browser, web.url)
    second = open_tab(browser, web.url)
    assert web.logged(r"tab 2 opened \(2 of 4 sessions\)"), web.tail()
    ready(first)
    ready(second)
    send(first, "Name a fruit.")
    send(second, "Name a river.")
    for page in (first, second):
        wait_text(page, "a whole reply", lambda t: " tok/s · " in t, 120)
    assert "Name a fruit." in terminal_text(first) and "Name a river." not in terminal_text(first)
    assert "Name a river." in terminal_text(second) and "Name a fruit." not in terminal_text(second)
    titles = sorted(c["title"] for c in _history(web))
    assert titles == ["Name a fruit.", "Name a river."], titles
    first.close()
    wait_until("the first tab's chat to end", lambda: web.logged(r"tab 1 closed \(1 of 4"), 30, web.tail)
    # stopped with a tab open (Ctrl+C, SIGTERM): the tab is told at once, its chat quits
    chats = [p for p in psutil.Process(web.proc.pid).children(recursive=True) if "loopchat" in " ".join(p.cmdline())]
    assert chats, "the second tab's chat process"
    web.proc.terminate()
    assert web.proc.wait(15) == 0, web.tail()  # (aiohttp alone waits ~20 s for the open tab)
    assert not [p for p in chats if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert web.logged(r"tab 2 closed \(0 of 4"), web.tail()


async def _websocket_over_the_limit(url: str) -> tuple[str, bool]:
    """What a tab whose page loaded before the limit was reached gets on its websocket."""
    import aiohttp

    async with aiohttp.ClientSession() as session, session.ws_connect(url.replace("http", "ws", 1) + "/ws") as ws:
        message = await ws.receive(timeout=30)
        after = await ws.receive(timeout=30)
        return message.data.decode(), after.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)


def test_a_tab_over_the_limit_gets_a_page_that_says_why(browser, tmp_path) -> None:
    web = Web(tmp_path / "home", "--max-sessions", "1")
    try:
        first = open_tab(browser, web.url)
        over = browser.new_page()
        response = over.goto(web.url, wait_until="domcontentloaded", timeout=30_000)
        assert response is not None and response.status == 503
        text = over.inner_text("#busy")
        assert "1 tab already run the chat" in text and "--max-sessions 1" in text and "Close one of them" in text
        # a page loaded before the limit was reached, its websocket after: told in its terminal, then closed
        # (in a thread of its own: Playwright's sync API runs an event loop in this one)
        with ThreadPoolExecutor(1) as pool:
            said, closed = pool.submit(asyncio.run, _websocket_over_the_limit(web.url)).result(60)
        assert "loopchat web is busy: 1 tab already run the chat" in said and closed
        # closing the tab frees its place: the next tab gets the chat
        first.close()
        wait_until("the first tab's chat to end", lambda: web.logged(r"tab 1 closed \(0 of 1"), 30, web.tail)
        again = open_tab(browser, web.url)
        assert "Loop" in terminal_text(again)
        assert web.logged(r"tab 2 opened \(1 of 1"), web.tail()
    finally:
        assert web.stop() == 0, web.tail()
