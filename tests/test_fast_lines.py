"""The drawing fast path of the transcript and the loop panel (`plain_box`: padding and
line filters done by the widget on cached strips) paints exactly what Textual's own
styles cache paints for the same widget, cell for cell."""

from __future__ import annotations

from typing import Any

import pytest
from rich.cells import cell_len
from rich.style import Style
from textual._segment_tools import line_pad
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget
from tui_fixtures import FakeBackend, wait_run

from loopchat.tui import transcript as transcript_module
from loopchat.tui.app import LoopChatApp
from loopchat.tui.fast_static import FastStatic, plain_box
from loopchat.tui.prefs import Prefs


def _cells(strips: list[Strip]) -> list[list[tuple[str, Any]]]:
    rows = []
    for strip in strips:
        row: list[tuple[str, Any]] = []
        for seg in strip:
            for ch in seg.text:
                row.append((ch, seg.style))
                row.extend(("", seg.style) for _ in range(cell_len(ch) - 1))
        rows.append(row)
    return rows


def _crops(widget: Widget) -> list[Region]:
    width, height = widget.region.size
    return [
        Region(0, 0, width, height),  # the whole widget
        Region(0, height - 3, width, 3),  # the last lines
        Region(2, 1, width - 5, 4),  # columns cut on both sides
        Region(0, 5, 1, 2),  # the left padding alone
    ]


def _differences(widget: Widget) -> list[str]:
    """Crops where the widget's render_lines differs from the stock styles-cache path."""
    assert plain_box(widget)  # the fast path is what is being compared
    out = []
    for crop in _crops(widget):
        fast = _cells(widget.render_lines(crop))
        widget._styles_cache.clear()
        stock = _cells(Widget.render_lines(widget, crop))
        if fast != stock:
            for y, (a, b) in enumerate(zip(fast, stock)):
                if a != b:
                    out.append(f"{type(widget).__name__} {crop} row {y}: {''.join(c for c, _ in a)!r} vs {''.join(c for c, _ in b)!r}")
                    break
            else:
                out.append(f"{type(widget).__name__} {crop}: {len(fast)} rows vs {len(stock)}")
    return out


@pytest.mark.parametrize("prefs", [Prefs(markdown=False), Prefs(markdown=True, token_boundaries=True, prob_colours=True)])
async def test_fast_path_paints_what_the_styles_cache_paints(prefs, tmp_path) -> None:
    words = [f" word{i}" if i % 9 else f"\n**line {i}**:" for i in range(120)]
    app = LoopChatApp(FakeBackend(tokens=words, delay=0.001), prefs=prefs, prefs_path=tmp_path / "p.json")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"go", "enter")
        await wait_run(pilot)
        await pilot.pause()
        panel_body = app.query_one(FastStatic)
        assert app.transcript.virtual_size.height > app.transcript.size.height  # it scrolls
        problems = _differences(app.transcript) + _differences(panel_body)
        app.transcript.focus()  # focus tints the transcript's background
        await pilot.pause()
        app.transcript.scroll_to(y=3, animate=False, immediate=True)
        await pilot.pause()
        problems += _differences(app.transcript)
        await pilot.press("alt+left")  # a selected token: the panel shows that step
        await pilot.pause()
        problems += _differences(panel_body)
        assert problems == []


async def test_the_comparison_sees_a_wrong_pad(tmp_path, monkeypatch) -> None:
    """The check above fails when the fast path pads with the wrong style."""
    app = LoopChatApp(FakeBackend(), prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"go", "enter")
        await wait_run(pilot)
        await pilot.pause()
        transcript = app.transcript
        transcript._screen_key = None  # forget the lines padded so far
        monkeypatch.setattr(transcript_module, "line_pad", lambda line, left, right, style: line_pad(line, left, right, Style()))
        assert _differences(transcript)
