"""The transcript's vertical scrollbar, repainted without re-rendering every row.

While a reply streams, the transcript's scrollbar changes every few lines (the thumb
shrinks as the reply grows, and moves as the view follows it). Textual repaints a
scrollbar by rendering its renderable again and passing every row through the styles
cache, a few times a second; `benchmarks/render_ab.py --ab scrollbar` measures what that
costs the UI thread per token against this bar (see docs/performance.md, "Textual's drawing
costs").

A vertical bar is made of a handful of distinct rows (track above the thumb, track
below it, thumb, and the two rows where a partial-cell glyph ends the thumb), and the
path from a row's segment to its painted strip does not depend on which row it is on
(a scrollbar has no border or padding). `RowCachedScrollBar` therefore computes the
bar's segments as Textual's renderer does (cheap), and paints each row with the strip
Textual painted for the same segment before; only a segment it has not seen yet sends
it through Textual's own path (which fills the cache). Everything else the painted rows
depend on (width, style, background, line filters) keys the cache.
`tests/test_fast_lines.py` compares it with Textual's own rendering, cell for cell.

`vertical_scrollbar(widget)` makes one for a widget the way Textual's own
`Widget.vertical_scrollbar` makes its bar (its private `_vertical_scrollbar` and
`App._start_widget`).
"""

from __future__ import annotations

from typing import Any

from rich.color import Color
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.scrollbar import ScrollBar, ScrollBarRender
from textual.strip import Strip
from textual.widget import Widget

from loopchat.tui.render.lines import plain_box

if not hasattr(ScrollBarRender, "render_bar"):
    raise AttributeError("textual.scrollbar.ScrollBarRender has no render_bar")


def vertical_scrollbar(widget: Widget) -> ScrollBar:
    """`widget`'s vertical scrollbar, a RowCachedScrollBar (made on first use)."""
    if widget._vertical_scrollbar is None:
        widget._vertical_scrollbar = bar = RowCachedScrollBar(
            vertical=True, name="vertical", thickness=widget.scrollbar_size_vertical
        )
        bar.display = False
        widget.app._start_widget(widget, bar)
    return widget._vertical_scrollbar


class RowCachedScrollBar(ScrollBar):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rows: dict[Segment, Strip] = {}  # a row's segment -> its painted strip
        self._rows_key: tuple | None = None

    def render_lines(self, crop: Region) -> list[Strip]:
        renderable = self.render()
        if not (
            self.vertical
            and type(renderable) is ScrollBarRender
            and isinstance(renderable.style, Style)
            and plain_box(self)
        ):
            return super().render_lines(crop)
        width, height = self.size
        key = (width, height, self.visual_style, self.background_colors, tuple(self.get_line_filters()))
        if key != self._rows_key:
            self._rows_key = key
            self._rows = {}
        style = renderable.style  # a Style here (ScrollBar.render makes one)
        bar = ScrollBarRender.render_bar(  # as ScrollBarRender.__rich_console__ calls it
            size=height,
            virtual_size=renderable.virtual_size,
            window_size=renderable.window_size,
            position=renderable.position,
            thickness=width,
            vertical=True,
            back_color=style.bgcolor or Color.parse("#555555"),
            bar_color=style.color or Color.parse("bright_magenta"),
        ).segments
        rows = self._rows
        get = rows.get
        known = [get(segment) for segment in bar] if len(bar) == height else []
        lines = [line for line in known if line is not None]
        if len(bar) != height or len(lines) < height:
            # a row not seen yet: Textual paints the whole bar, and we learn its rows
            lines = super().render_lines(Region(0, 0, width, height))
            if len(bar) == height == len(lines):
                for segment, line in zip(bar, lines):
                    rows[segment] = line
        return [line.crop(crop.x, crop.right) for line in lines[crop.y : crop.bottom]]
