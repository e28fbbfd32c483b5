"""The drawing fast path of the transcript and the loop panel (`plain_box`: padding and
line filters done by the widget on cached strips) paints exactly what Textual's own
styles cache paints for the same widget, cell for cell."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from rich.style import Style
from textual._segment_tools import line_pad
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget
from tui_fixtures import FakeBackend, fake_app, reply_to, wait_for

from loopchat.chat.prefs import Prefs
from loopchat.tui.app import LoopChatApp
from loopchat.tui.fast_static import FastStatic
from loopchat.tui.render import lines as render_lines
from loopchat.tui.render.lines import plain_box


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
                    out.append(
                        f"{type(widget).__name__} {crop} row {y}: {''.join(c for c, _ in a)!r} vs {''.join(c for c, _ in b)!r}"
                    )
                    break
            else:
                out.append(f"{type(widget).__name__} {crop}: {len(fast)} rows vs {len(stock)}")
    return out


@pytest.mark.parametrize(
    "prefs", [Prefs(markdown=False), Prefs(markdown=True, token_boundaries=True, prob_colours=True)]
)
async def test_fast_path_paints_what_the_styles_cache_paints(prefs, tmp_path) -> None:
    words = [f" word{i}" if i % 9 else f"\n**line {i}**:" for i in range(120)]
    app = LoopChatApp(FakeBackend(tokens=words, delay=0.001), prefs=prefs, prefs_path=tmp_path / "p.json")
    async with app.run_test(size=(100, 30)) as pilot:
        await reply_to(pilot, "go")
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
    app = fake_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await reply_to(pilot, "go")
        await pilot.pause()
        transcript = app.transcript
        transcript._screen_lines.clear()  # forget the lines padded so far
        monkeypatch.setattr(
            render_lines, "line_pad", lambda line, left, right, style: line_pad(line, left, right, Style())
        )
        assert _differences(transcript)


@pytest.mark.parametrize("width", [14, 23, 47, 80])
@pytest.mark.parametrize("prefs", [Prefs(), Prefs(prob_colours=True, token_boundaries=True)], ids=["plain", "coloured"])
def test_a_streaming_reply_has_the_lines_of_its_text_wrapped_whole(width: int, prefs: Prefs) -> None:
    """Tokens added a few at a time (most frames only render the new ones onto the open
    line) give, after every frame, the lines rich gives for the reply so far wrapped in
    one go, segment for segment."""
    from rich.console import Console
    from rich.text import Text

    from loopchat.chat.conversation import STREAM, ReplyRecord
    from loopchat.events import Step
    from loopchat.trace import read_trace
    from loopchat.tui.blocks import ReplyView, _clickable, token_style

    _, traced = read_trace(Path(__file__).parent / "data" / "reply.jsonl")
    steps = [t.event for t in traced if isinstance(t.event, Step)]
    # more text than one reply has, with a line break and a word longer than the line
    steps += [replace(s, index=len(steps) + i) for i, s in enumerate(steps)]
    steps[7] = replace(steps[7], text=" line\nbreak", piece=" line\nbreak")
    steps[12] = replace(steps[12], text=" " + "x" * 30, piece=" " + "x" * 30)
    assert any(s.text.startswith(" ") for s in steps) and len(steps) > 60
    console = Console(width=200, color_system="truecolor")
    record = ReplyRecord(1, STREAM, ())
    view = ReplyView(record, prefs)
    view.render(console, width)
    fast_path = 0
    shown = 0
    for size in [1, 3, 2, 5, 1, 7, 4] * 20:
        new = steps[shown : shown + size]
        if not new:
            break
        record.steps.extend(new)
        before = len(view._frozen)
        view.add_steps(new)
        fast_path += len(view._frozen) == before and "\n" not in "".join(s.text for s in new)
        shown += len(new)
        whole = Text()
        for n, s in enumerate(st for st in record.steps if st.text and not st.is_stop):
            whole.append(s.text, _clickable(token_style(s, n, prefs, False), 1, s.index))
        expected = [view._line_strip(line) for line in whole.wrap(console, width - 2, overflow="fold")]
        got = [view.line(i) for i in range(2, view.height)]
        assert [list(g) for g in got] == [list(e) for e in expected], (shown, width)
    assert shown == len(steps) and fast_path > 5  # frames that only added to the open line


def _bar_differences(bar) -> list[str]:
    """Rows where the scrollbar's render_lines differs from Textual's own path."""
    region = Region(0, 0, *bar.size)
    fast = _cells(bar.render_lines(region))
    bar.refresh()  # Textual renders the bar again from scratch
    stock = _cells(Widget.render_lines(bar, region))
    return [f"row {y}: {a} vs {b}" for y, (a, b) in enumerate(zip(fast, stock)) if a != b] + (
        [f"{len(fast)} rows vs {len(stock)}"] if len(fast) != len(stock) else []
    )


@pytest.mark.slow
async def test_the_transcript_scrollbar_paints_what_textual_paints(tmp_path, monkeypatch) -> None:
    from textual.geometry import Offset
    from textual.scrollbar import ScrollBar

    from loopchat.tui.render.scrollbar import RowCachedScrollBar

    stock_paints = []
    monkeypatch.setattr(
        ScrollBar, "render_lines", lambda self, crop: stock_paints.append(1) or Widget.render_lines(self, crop)
    )
    words = [f" word{i}" for i in range(900)]
    app = LoopChatApp(
        FakeBackend(tokens=words, delay=0.0005), prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json"
    )
    async with app.run_test(size=(100, 30)) as pilot:
        await reply_to(pilot, "go")
        await pilot.pause()
        transcript = app.transcript
        bar = transcript.vertical_scrollbar
        assert isinstance(bar, RowCachedScrollBar) and bar.display
        problems = []
        positions = range(0, transcript.max_scroll_y + 1)
        assert len(positions) > 60
        for y in positions:  # every position of the thumb, each painted from cached rows
            transcript.scroll_to(y=y, animate=False, immediate=True)
            await pilot.pause()
            problems += _bar_differences(bar)
        cached_paints = len(positions) - len(stock_paints)
        bar.mouse_over = True  # other colours: new rows
        for y in (0, 7, transcript.max_scroll_y):
            transcript.scroll_to(y=y, animate=False, immediate=True)
            await pilot.pause()
            problems += _bar_differences(bar)
        bar.grabbed = Offset(0, 3)
        await pilot.pause()
        problems += _bar_differences(bar)
        assert problems == []
        assert cached_paints > len(positions) * 0.8, (cached_paints, len(positions))
        # and the comparison sees a row painted with the wrong strip
        bar.grabbed = None
        bar.mouse_over = False
        await pilot.pause()
        bar.render_lines(Region(0, 0, *bar.size))
        first = next(iter(bar._rows.values()))
        bar._rows = dict.fromkeys(bar._rows, first)
        assert _bar_differences(bar)


class _Narrow(App[None]):
    CSS = "FastStatic { width: 20; height: auto; }"

    def compose(self) -> ComposeResult:
        yield FastStatic()


async def test_a_fast_static_is_as_high_as_its_lines_however_long_they_are() -> None:
    """It draws line y on row y, cut at its width: lines made for a wider view (the document's
    header during a resize) wrapped in Textual's own measure, and the header stood 13 rows high
    over its 5 lines at 120x40 (test_tui_document's short view, at the Pilot's 2 ms pace)."""
    app = _Narrow()
    async with app.run_test(size=(40, 20)) as pilot:
        static = app.query_one(FastStatic)
        static.set_lines([[("x" * 50, Style())] for _ in range(3)])
        static.refresh(layout=True)
        await pilot.pause()
        await wait_for(pilot, lambda: static.size.width == 20, 5, "the layout")
        assert static.size.height == 3 and [s.text for s in static.render_lines(Region(0, 0, 20, 3))] == ["x" * 20] * 3


class _Fitted(App[None]):
    CSS = "FastStatic { width: 20; }"

    def compose(self) -> ComposeResult:
        yield FastStatic(fit=True)


async def test_a_fitted_fast_static_follows_its_lines_with_a_layout_between_two_changes() -> None:
    """13 lines, a layout of the screen before the widget's own idle (another widget's resize
    does that on a loaded machine), then 5 lines: 5 rows high. Asked by refresh(layout=True),
    Textual kept the 13 rows measured in between (the document view's header after a resize)."""
    app = _Fitted()
    async with app.run_test(size=(40, 30)) as pilot:
        static = app.query_one(FastStatic)
        for n in (2, 13, 5):
            static.set_lines([[("x", Style())] for _ in range(n)])
            app.screen._refresh_layout()  # (Textual's own layout pass, here before the widget's idle)
        await wait_for(pilot, lambda: static.size.height == 5, 5, "5 rows")
        await pilot.pause()
        assert static.size.height == 5 and len(static.lines) == 5
