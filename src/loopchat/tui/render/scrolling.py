"""A scroll view that grows without a layout of the whole screen.

Assigning `virtual_size` asks Textual for a layout of the screen (costly with this app's
widgets: see docs/performance.md, "Textual's drawing costs"). When only the height
changed and the vertical scrollbar neither appears nor goes, nothing else on screen
moves: setting the reactive quietly and updating the scroll geometry is enough
(Textual's private `Widget._scroll_update`, and its `_anchor_released` for a view the
user scrolled away from the end).
"""

from __future__ import annotations

from textual.geometry import Size
from textual.widget import Widget

if not callable(getattr(Widget, "_scroll_update", None)):
    raise AttributeError("textual.widget.Widget has no _scroll_update")


def grow(widget: Widget, size: Size) -> bool:
    """Give `widget` the virtual size `size` without a layout, if nothing but its
    height changes (True); False when it takes a layout (assign `virtual_size`)."""
    height = widget.scrollable_content_region.height
    overflow = widget.styles.overflow_y
    shows_scrollbar = overflow == "scroll" or (overflow == "auto" and size.height > height)
    if not (
        widget.is_mounted
        and height
        and widget.show_vertical_scrollbar == shows_scrollbar
        and size.width == widget.virtual_size.width
    ):
        return False
    widget.set_reactive(Widget.virtual_size, size)
    widget._scroll_update(size)
    if widget.is_anchored and not widget._anchor_released:
        widget.scroll_end(animate=False, immediate=True)
    return True
