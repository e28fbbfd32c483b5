"""A Static-like widget for content redrawn many times a second.

`textual.widgets.Static.update()` calls `refresh(layout=True)` (a re-layout of the whole
screen) and renders all of its content again. `FastStatic` is for a widget whose size
comes from CSS. Its content is a list of screen lines, each a `Line`: a tuple of
(text, rich Style) pieces that already fits the width. `set_lines()` compares them with
the lines shown and repaints only the lines that changed (no layout pass; nothing at all
when nothing changed). Each line becomes a Strip once, reused until the line changes.
"""

from __future__ import annotations

import io

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.style import Style as TextualStyle
from textual.widget import Widget

#: One screen line: (text, style) pieces, left to right.
Line = tuple[tuple[str, Style], ...]

_CONSOLE = Console(width=1000, file=io.StringIO(), color_system=None, legacy_windows=False)


def line_to_text(line: Line) -> Text:
    t = Text(end="")
    for s, style in line:
        t.append(s, style)
    return t


def lines_to_text(lines: list[Line]) -> Text:
    """The lines as one Text (for tests and for code that reads what is shown)."""
    t = Text()
    for i, line in enumerate(lines):
        if i:
            t.append("\n")
        for s, style in line:
            t.append(s, style)
    return t


def text_to_lines(text: Text, width: int) -> list[Line]:
    """`text` wrapped (or cut, if no_wrap) to `width` exactly as rich prints it, as Lines."""
    out: list[Line] = []
    for t in text.wrap(_CONSOLE, width):
        out.append(tuple((seg.text, seg.style or Style.null()) for seg in t.render(_CONSOLE, end="") if seg.text))
    return out


class FastStatic(Widget):
    """Shows a list of Lines; give it a fixed size in CSS (it never asks for a re-layout)."""

    DEFAULT_CSS = """
    FastStatic {
        height: auto;
    }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._lines: list[Line] = []
        self._strips: list[Strip | None] = []
        self._strip_key: tuple[int, Style] | None = None  # (width, base style) of the strips
        self._styles: dict[Style, Style] = {}  # piece style -> base + piece style
        self._pad_style = Style.null()
        self._paint_base: Style | None = None

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

    def render(self) -> Text:
        """All lines as one Text (drawing itself goes through render_line)."""
        return lines_to_text(self._lines)

    @property
    def renderable(self) -> Text:
        return self.render()

    def render_line(self, y: int) -> Strip:
        """Line `y`, exactly the widget's width (a cached Strip unless the line changed)."""
        width = self.size.width
        base = self._paint_base or self.visual_style.rich_style
        key = (width, base)
        if key != self._strip_key:  # resized or restyled: every strip is stale
            self._strip_key = key
            self._strips = [None] * len(self._lines)
            self._styles = {}
            base_background, background = self.background_colors
            self._pad_style = TextualStyle(background=base_background + background).rich_style
        if y >= len(self._lines):
            return Strip.blank(width, self._pad_style)
        strip = self._strips[y]
        if strip is None:
            styles = self._styles
            segments = []
            for s, style in self._lines[y]:
                combined = styles.get(style)
                if combined is None:
                    combined = styles[style] = base + style
                segments.append(Segment(s, combined))
            strip = Strip(segments).adjust_cell_length(width, self._pad_style)
            self._strips[y] = strip
        return strip

    def _plain_box(self) -> bool:
        """No border, padding, outline or effect: lines can skip Textual's styles cache."""
        styles = self.styles
        return (
            not any(styles.gutter)
            and not styles.outline_top[0]
            and not styles.outline_bottom[0]
            and not styles.outline_left[0]
            and not styles.outline_right[0]
            and not styles.tint.a
            and self.opacity == 1.0
            and styles.text_opacity == 1.0
            and not (styles.has_rule("hatch") and styles.hatch != "none")
            and self.styles.content_align == ("left", "top")
            and self.text_selection is None
        )

    def render_lines(self, crop: Region) -> list[Strip]:
        # Fast path: the cached strips as they are (StylesCache would rebuild every
        # repainted line, border and padding logic included, ~50 us a line).
        if not self._plain_box():
            return super().render_lines(crop)
        render_line = self.render_line
        self._paint_base = self.visual_style.rich_style  # once per paint, not per line
        try:
            strips = [render_line(y) for y in crop.line_range]
        finally:
            self._paint_base = None
        filters = self.get_line_filters()
        if filters:
            _, background = self.background_colors
            for f in filters:
                strips = [strip.apply_filter(f, background) for strip in strips]
        if crop.column_span != (0, self.size.width):
            x1, x2 = crop.column_span
            strips = [strip.crop(x1, x2) for strip in strips]
        return strips
