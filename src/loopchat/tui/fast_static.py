"""A Static-like widget for content redrawn many times a second.

`textual.widgets.Static.update()` calls `refresh(layout=True)` (a re-layout of the whole
screen) and renders all of its content again. `FastStatic` is for a widget whose size
comes from CSS. Its content is a list of screen lines, each a `Line`: a tuple of
(text, rich Style) pieces that already fits the width. `set_lines()` compares them with
the lines shown and repaints only the lines that changed (no layout pass; nothing at all
when nothing changed). Each line becomes a Strip once, reused until the line changes.

On the fast paths (`render.fast()`), lines are drawn without Textual's styles cache
when it would only apply the app's line filters (`render.lines.plain_box`: no border,
padding, tint or opacity), which saves a measurable share of a frame (see
docs/performance.md, "Textual's drawing costs").
"""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.cache import LRUCache
from textual.filter import ANSIToTruecolor, LineFilter
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.style import Style as TextualStyle
from textual.widget import Widget

from loopchat.chat.views.lines import Line, lines_to_text, text_to_lines
from loopchat.tui import render

#: Line and the conversions live with the views' models (Textual-free); named here too
__all__ = ["FastStatic", "Line", "lines_to_text", "split_filters", "text_to_lines"]


def split_filters(widget: Widget) -> tuple[ANSIToTruecolor | None, list[LineFilter]]:
    """The app's truecolor filter (which a widget can apply to its styles once, ahead of
    time: applying it again changes nothing) and the other line filters, in order."""
    truecolor: ANSIToTruecolor | None = None
    others: list[LineFilter] = []
    for f in widget.get_line_filters():
        if truecolor is None and not others and isinstance(f, ANSIToTruecolor):
            truecolor = f
        else:
            others.append(f)
    return truecolor, others


class FastStatic(Widget):
    """Shows a list of Lines; give it a fixed size in CSS (it never asks for a re-layout), or
    `fit=True`: its height is then its number of lines, set as its style when that changes.

    (Not `refresh(layout=True)`: Textual 8 counts a widget's layout refreshes in its box-model
    cache key only while none is pending, so two before the widget's idle count once, and a
    height measured by a layout in between stays under the same key. The document view's
    header kept 13 rows for 5 lines that way after a resize. A new style is a new key.)"""

    DEFAULT_CSS = """
    FastStatic {
        height: auto;
    }
    """

    def __init__(self, fit: bool = False, **kw: Any) -> None:
        self._fast = render.fast()  # draw without the styles cache where it applies
        super().__init__(**kw)
        self._fit = fit
        self._lines: list[Line] = []
        self._strips: list[Strip | None] = []
        self._strip_key: tuple | None = None  # what the strips were made for
        self._styles: LRUCache[Style, Style] = LRUCache(1024)  # piece style -> final style
        self._pad_style = Style.null()
        self._other_filters: list[LineFilter] = []
        self._width = 0
        self._base = Style.null()  # the widget's own style, under every piece
        self._finish = lambda style: style  # the truecolor filter, applied ahead of time

    @property
    def lines(self) -> list[Line]:
        return self._lines

    def set_lines(self, lines: list[Line]) -> int:
        """Show `lines`; repaint only the lines that differ. Returns how many were repainted."""
        old, old_strips = self._lines, self._strips
        n_old = len(old)
        strips: list[Strip | None] = []
        dirty: list[int] = []
        for y, line in enumerate(lines):
            if y < n_old and old[y] == line:
                strips.append(old_strips[y])
            else:
                strips.append(None)
                dirty.append(y)
        dirty.extend(range(len(lines), n_old))
        self._lines, self._strips = list(lines), strips
        if self._fit and len(lines) != n_old:
            self.styles.height = len(lines)
        if dirty and self.is_mounted:
            width = max(1, self.size.width)
            start = prev = dirty[0]
            regions = []
            for y in dirty[1:]:  # one region per run of consecutive lines
                if y != prev + 1:
                    regions.append(Region(0, start, width, prev - start + 1))
                    start = y
                prev = y
            regions.append(Region(0, start, width, prev - start + 1))
            self.refresh(*regions)
        return len(dirty)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """One row a line: render_line draws line y on row y, cut at the width. (Textual's own
        measure wraps render()'s Text at the width: lines made for a wider view, measured in a
        narrower one during a resize, came out taller than they are drawn, and stayed so.)"""
        return len(self._lines)

    def render(self) -> Text:
        """All lines as one Text (drawing itself goes through render_line)."""
        return lines_to_text(self._lines)

    @property
    def renderable(self) -> Text:
        return self.render()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strip_key = None  # the strips are made again on the next paint

    def _check_strips(self) -> None:
        """Forget every strip if the width, the style, the background or the app's
        truecolor filter changed since they were made (once per paint): a restyle
        (notify_style_update) does not tell of a new width, an inline or animated style,
        an ancestor's background or the app's filters."""
        width = self.size.width
        base = self.visual_style.rich_style
        base_background, background = self.background_colors
        truecolor, self._other_filters = split_filters(self)
        key = (width, base, base_background, background, truecolor)
        if key == self._strip_key:
            return
        self._strip_key = key
        self._width = width
        self._strips = [None] * len(self._lines)
        self._styles.clear()
        pad = TextualStyle(background=base_background + background).rich_style
        bg = background.rich_color
        if truecolor is not None:
            self._finish = lambda style: truecolor.truecolor_style(style, bg)
        else:
            self._finish = lambda style: style
        self._base = base
        self._pad_style = self._finish(pad)

    def render_line(self, y: int) -> Strip:
        """Line `y`, exactly the widget's width (a cached Strip unless the line changed),
        its styles already through the app's truecolor filter."""
        self._check_strips()
        return self._line(y)

    def _line(self, y: int) -> Strip:
        width = self._width
        if y >= len(self._lines):
            return Strip.blank(width, self._pad_style)
        strip = self._strips[y]
        if strip is None:
            styles, base, finish = self._styles, self._base, self._finish
            segments = []
            cells = 0
            for s, style in self._lines[y]:
                combined = styles.get(style)
                if combined is None:
                    combined = styles[style] = finish(base + style)
                segments.append(Segment(s, combined))
                cells += cell_len(s)
            if cells < width:
                segments.append(Segment(" " * (width - cells), self._pad_style))
                strip = Strip(segments, width)
            else:
                strip = Strip(segments, cells).crop(0, width) if cells > width else Strip(segments, width)
            self._strips[y] = strip
        return strip

    def render_lines(self, crop: Region) -> list[Strip]:
        if not (self._fast and render.lines.plain_box(self)) or any(self.styles.padding):
            return super().render_lines(crop)
        self._check_strips()
        line = self._line
        strips = [line(y) for y in crop.line_range]
        if self._other_filters:
            _, background = self.background_colors
            for f in self._other_filters:
                strips = [strip.apply_filter(f, background) for strip in strips]
        if crop.column_span != (0, self._width):
            x1, x2 = crop.column_span
            strips = [strip.crop(x1, x2) for strip in strips]
        return strips
