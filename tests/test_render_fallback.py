"""The app on Textual's stock rendering (what it does on an untested Textual, see
tui/render/__init__.py) behaves as on the fast paths and draws the same screens.

Every test of test_tui_units.py and test_tui_keys.py runs again here with
LOOPCHAT_STOCK_RENDER=1, set before the test makes its app (widgets decide when they are
made): a reply streams, a click selects a token, the view follows the reply, resizes,
every key. All but one: Textual's own compositor leaves cyclic strips behind
(`Strip.divide`, README Performance), so the cycle-collector check is for the fast
paths only. And a replayed reply draws the same screen, cell for cell, both ways (the
snapshot tests' four screens).
"""

from __future__ import annotations

import pytest
import test_tui_keys
import test_tui_units
from textual.screen import Screen
from textual.scrollbar import ScrollBar
from textual.widgets import Input
from tui_fixtures import REPLY_TRACE, fake_app, reply_to, wait_run

from loopchat.chat.prefs import Prefs
from loopchat.tui import render
from loopchat.tui.fast_static import FastStatic
from loopchat.tui.launch import create_app

pytestmark = pytest.mark.slow

#: tests that check a property of the fast paths themselves
FAST_PATHS_ONLY = {"test_frames_leave_no_strips_for_the_cycle_collector"}

for _module in (test_tui_units, test_tui_keys):
    for _name, _test in vars(_module).items():
        if _name.startswith("test_") and callable(_test) and _name not in FAST_PATHS_ONLY:
            globals()[_name] = _test  # collected here too, and run with the autouse fixture below


@pytest.fixture(autouse=True)
def stock_render(monkeypatch) -> None:
    monkeypatch.setenv(render.STOCK_ENV, "1")


async def test_the_app_here_draws_with_textuals_stock_paths(tmp_path) -> None:
    app = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await reply_to(pilot, "hello")
        assert type(app.screen) is Screen
        assert type(app.transcript.vertical_scrollbar) is ScrollBar
        assert not app.query_one(FastStatic)._fast and app.transcript._screen_lines is None
        notices = [n.message for n in app.notices]
        assert notices == ["LOOPCHAT_STOCK_RENDER=1: using Textual's stock rendering (slower)"]


Cells = list[list[tuple[str, object]]]


def _cells(app) -> Cells:
    """The whole screen as Textual's compositor renders it in full: (character, style) rows."""
    rows = []
    for strip in app.screen._compositor.render_strips():
        rows.append([(ch, seg.style) for seg in strip for ch in seg.text])
    return rows


def _text(cells: Cells) -> str:
    return "\n".join("".join(ch for ch, _ in row) for row in cells)


async def _screen(monkeypatch, tmp_path, stock: bool, size: tuple[int, int], keys: tuple[str, ...], **prefs) -> Cells:
    """The screen after a replay of tests/data/reply.jsonl (and `keys`)."""
    if stock:
        monkeypatch.setenv(render.STOCK_ENV, "1")
    else:
        monkeypatch.delenv(render.STOCK_ENV, raising=False)
    app = create_app(replay=str(REPLY_TRACE), replay_speed=0, prefs=Prefs(**prefs), prefs_path=tmp_path / "p.json")
    async with app.run_test(size=size) as pilot:
        await wait_run(pilot, 10)
        await pilot.pause()
        assert (type(app.screen) is Screen) == stock
        app.clear_notifications()  # the stock paths' notice
        await pilot.press(*keys)
        await pilot.pause()
        # a text field's cursor blinks on a timer: held steady, the two paths are compared
        # at the same blink state whenever the picture is taken
        for field in app.screen.query(Input):
            field.cursor_blink = False
        # the picture once two of them 0.1 s apart agree: a screen's footer shows its keys a
        # frame or more after the screen itself (Textual redraws it on a later message), and
        # the Pilot's pause ends when the process looks idle, which may come first
        cells = _cells(app)
        for _ in range(50):
            await pilot.pause(0.1)
            again = _cells(app)
            if again == cells:
                return cells
            cells = again
        raise AssertionError("the screen did not settle in 5 s")


@pytest.mark.skipif(not REPLY_TRACE.exists(), reason="tests/data/reply.jsonl not recorded")
@pytest.mark.parametrize(
    "size, keys, prefs, shown",
    [
        ((120, 40), (), {}, "Assistant · reply 1"),
        ((80, 24), (), {"markdown": False, "prob_colours": True}, "Assistant · reply 1"),
        (
            (120, 40),
            ("alt+left", "alt+left", "alt+left"),
            {"markdown": False, "token_boundaries": True},
            "Assistant · reply 1",
        ),
        # (the dialog, with its logit bias row, covers the reply at 80x24)
        ((80, 24), ("f2",), {}, "Sampling settings"),
    ],
    ids=["wide", "narrow", "token-selected", "settings-dialog"],
)
async def test_a_replayed_reply_looks_the_same_on_both_paths(monkeypatch, tmp_path, size, keys, prefs, shown) -> None:
    fast = await _screen(monkeypatch, tmp_path, False, size, keys, **prefs)
    stock = await _screen(monkeypatch, tmp_path, True, size, keys, **prefs)
    assert shown in _text(fast)  # the screen has the reply (or the dialog) on it
    for y, (a, b) in enumerate(zip(fast, stock)):
        assert a == b, f"row {y}: {_text([a])!r} vs {_text([b])!r}"
    assert len(stock) == len(fast) == size[1]


async def test_the_comparison_sees_a_difference(monkeypatch, tmp_path) -> None:
    """The comparison above sees the transcript's colours: token boundaries (F6) on one
    side change only the styles of the reply's rows, and that is a difference."""
    plain = await _screen(monkeypatch, tmp_path, False, (120, 40), (), markdown=False)
    bounds = await _screen(monkeypatch, tmp_path, True, (120, 40), ("f6",), markdown=False)
    differ = [y for y, (a, b) in enumerate(zip(plain, bounds)) if a != b]
    assert differ and all(_text([plain[y]]) == _text([bounds[y]]) for y in differ)
    assert all("│" in _text([plain[y]]) for y in differ)  # rows of the reply's body
