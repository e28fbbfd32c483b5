"""Widgets that paint their own lines the way Textual's styles cache would.

For a widget with no border, outline, tint, opacity or vertical padding, Textual's
styles cache only pads each line left and right and applies the app's line filters, yet
it is not cheap per line (see docs/performance.md, "Textual's drawing costs"). The
transcript and the loop panel do that work themselves, once per line, on strips they
keep (`tests/test_fast_lines.py` compares them with the styles cache, cell for cell).
`plain_box` says when that applies; it reads rich's private `Style._link_id` and
`_meta`, and `ScreenLines` pads with Textual's private `_segment_tools.line_pad`.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.style import Style
from textual._segment_tools import line_pad
from textual.cache import LRUCache
from textual.geometry import Region
from textual.strip import Strip
from textual.style import Style as TextualStyle
from textual.widget import Widget

if not all(hasattr(Style(), name) for name in ("_link_id", "_meta")):
    raise AttributeError("rich.style.Style has no _link_id / _meta")


def plain_box(widget: Widget) -> bool:
    """True when Textual's styles cache would only pad `widget`'s lines left and right
    and apply the line filters: no border, outline, vertical padding, tint, opacity,
    hatch, text selection or hovered clickable link."""
    styles = widget.styles
    pad_top, _, pad_bottom, _ = styles.padding
    hover = widget.hover_style
    return (
        not pad_top
        and not pad_bottom
        and not any(edge[0] for edge in styles.border)
        and not any(edge[0] for edge in styles.outline)
        and not styles.tint.a
        and widget.opacity == 1.0
        and styles.text_opacity == 1.0
        and not (styles.has_rule("hatch") and styles.hatch != "none")
        and widget.text_selection is None
        and not (widget.auto_links and hover._link_id and hover._meta and "@click" in hover.meta)
    )


#: a view line's source (a block's Strip, None for a blank line) -> the line as shown
#: (cut to the view from a column, in the widget's style): see Transcript.content_line
ContentLine = Callable[[Strip | None, int, int], Strip]


class ScreenLines:
    """The lines of a scrolling view, padded and filtered for the screen, each kept
    until its source line, its scroll column or the widget's look changes.

    Keyed by the identity of the source Strip (a Strip compares by value and has no
    hash); the entry holds the source, so the id stays valid while it is cached.
    """

    def __init__(self, size: int = 2000) -> None:
        self._lines: LRUCache[tuple[int, int], tuple[Strip | None, Strip]] = LRUCache(size)
        self._key: tuple | None = None  # what the cached lines were made for

    def clear(self) -> None:
        self._lines.clear()
        self._key = None

    def render(
        self,
        widget: Widget,
        crop: Region,
        line_style: Style,
        source_line: Callable[[int], Strip | None],
        content_line: ContentLine,
    ) -> list[Strip] | None:
        """The screen lines in `crop` (None: not a plain box, use Textual's own path).
        `source_line(y)` is the source of virtual line y; `content_line` cuts it to the view."""
        if not plain_box(widget):
            return None
        width, content_width = widget.region.width, widget.content_region.width
        view_width = widget.scrollable_content_region.width
        _, pad_right, _, pad_left = widget.styles.padding
        base_background, background = widget.background_colors
        inner = TextualStyle(background=base_background + background).rich_style
        filters = tuple(widget.get_line_filters())
        # what notify_style_update does not announce: the size, an inline or animated
        # style, an ancestor's background, the app's filters
        key = (width, content_width, pad_left, pad_right, inner, line_style, filters, background)
        if key != self._key:
            self._key = key
            self._lines.clear()
        cache = self._lines
        scroll_x, scroll_y = widget.scroll_offset
        strips = []
        for y in crop.line_range:
            source = source_line(scroll_y + y)
            line_key = (id(source), scroll_x)
            cached = cache.get(line_key)
            if cached is not None and cached[0] is source:
                strips.append(cached[1])
                continue
            line = content_line(source, scroll_x, view_width)
            if line.cell_length != content_width:  # (a strip of that length would cache itself)
                line = line.adjust_cell_length(content_width, inner)
            line = Strip(line_pad(line, pad_left, pad_right, inner), width)
            for f in filters:
                line = line.apply_filter(f, background)
            cache[line_key] = (source, line)
            strips.append(line)
        if crop.column_span != (0, width):
            x1, x2 = crop.column_span
            strips = [strip.crop(x1, x2) for strip in strips]
        return strips
