"""The chat app's shape (issue 23): the app's notices observed through its public API,
the die bar posting typed messages, and no module reaching back into the app class."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from textual.app import App, ComposeResult
from tui_fixtures import fake_app, record_notices, wait_for

from loopchat.tui.step_mode import DRAW_N, StepBar

TUI = Path(__file__).parent.parent / "src" / "loopchat" / "tui"


async def test_the_app_keeps_its_notices_in_order_and_tells_its_listeners(tmp_path) -> None:
    app = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        heard = record_notices(app)
        app.notify("one", title="First", severity="warning")
        app.screen.notify("two")  # a widget's or a screen's notify goes through the app's
        await pilot.pause()
        assert [(n.message, n.title, n.severity) for n in app.notices][-2:] == [
            ("one", "First", "warning"),
            ("two", "", "information"),
        ]
        assert heard == ["one", "two"]
        app.clear_notifications()
        assert app.notices == []
        await pilot.press("ctrl+g")  # a key's refusal: said as a notice
        await wait_for(pilot, lambda: len(heard) == 3, 5, "the compare key's notice")
        assert "two finished replies" in heard[-1] and app.notices[-1].severity == "warning"


class _BarApp(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.posted: list[object] = []

    def compose(self) -> ComposeResult:
        yield StepBar(id="stepbar")

    def on_mount(self) -> None:
        bar = self.query_one(StepBar)
        bar.display = True
        bar.focus()

    def on_step_bar_step_requested(self, message: StepBar.StepRequested) -> None:
        self.posted.append(("draw", message.n))

    def on_step_bar_token_picked(self, message: StepBar.TokenPicked) -> None:
        self.posted.append(("pick", message.rank))

    def on_step_bar_search_requested(self, message: StepBar.SearchRequested) -> None:
        self.posted.append(("search",))


async def test_the_die_bar_posts_what_its_keys_ask_for() -> None:
    """The die bar owns its keys: each posts a typed message (the app passes it on)."""
    app = _BarApp()
    async with app.run_test(size=(80, 5)) as pilot:
        await pilot.press("enter", "n", "3", "9", "slash")
        await wait_for(pilot, lambda: len(app.posted) == 5, 5, "the bar's messages")
        assert app.posted == [("draw", 1), ("draw", DRAW_N), ("pick", 3), ("pick", 9), ("search",)]


def test_no_tui_module_reaches_back_into_the_app() -> None:
    """Only launch.py (which makes the app) imports tui/app.py, even under TYPE_CHECKING;
    and the app's shell does not import the app's layers above it."""
    above = {
        "loopchat.tui.app": {"launch.py"},
        "loopchat.tui.view_keys": {"app.py"},
        "loopchat.tui.shell": {"view_keys.py", "app.py"},
        "loopchat.tui.transcript": {"app.py", "shell.py", "reply_views.py"},  # not the blocks it lays out
    }
    for path in sorted(TUI.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in above:
                assert path.name in above[node.module], f"{path.name} imports {node.module}"


def test_the_store_link_and_the_session_parts_load_no_textual() -> None:
    code = (
        "import sys, loopchat.chat.history_link, loopchat.chat.session_core, loopchat.chat.session_events;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
