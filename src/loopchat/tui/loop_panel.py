"""The loop panel widget: one forward pass's record, drawn once per frame from the
latest Step event, or from a past step the user selected.

What it shows is made without Textual in chat/views/panel.py (`panel_lines` of a
`PanelView`); this widget only draws it: nothing is made again when the view has not
changed since the last frame, and the lines are shown by a `FastStatic` (repaints only
the lines that changed, without a screen re-layout).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widget import Widget

from loopchat.chat.views.panel import panel_lines, panel_renderable
from loopchat.chat.views.panel_view import PanelView, view_key
from loopchat.chat.views.reply_index import PanelCaches
from loopchat.tui.fast_static import FastStatic

#: PanelView, panel_lines and panel_renderable: the panel's model, named here too
__all__ = ["LoopPanel", "PanelView", "panel_lines", "panel_renderable"]


class LoopPanel(Widget):
    """Redrawn at most once per frame, only when something it shows changed.

    The border and padding (#panel in styles.tcss) belong to this widget, which is never
    repainted per frame; the lines live in a borderless FastStatic child, so a frame only
    repaints the changed lines of that child (border drawing is the costly part of a
    Textual line repaint).
    """

    DEFAULT_CSS = """
    LoopPanel > FastStatic {
        width: 100%;
        height: 100%;
    }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.border_title = "Loop"
        self.view: PanelView | None = None
        self._key: tuple | None = None
        self._caches = PanelCaches()
        self.body = FastStatic()

    def compose(self) -> ComposeResult:
        yield self.body

    @property
    def text(self) -> Text:
        """What the panel shows, as one Text."""
        return self.body.render()

    def show(self, view: PanelView) -> None:
        self.view = view
        view.width = max(30, self.content_size.width or view.width)
        view.height = self.content_size.height or view.height
        key = view_key(view)
        if key == self._key:
            return
        self._key = key
        self.body.set_lines(panel_lines(view, self._caches))

    def on_resize(self) -> None:
        if self.view is not None:
            self.show(self.view)
