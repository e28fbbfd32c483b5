"""F11: the logit lens of the pass the panel shows, on a screen of its own (its lines:
chat/views/lens_view.py). The lens is computed when asked (chat/session_lens.py); the
screen shows "computing…" until the probe's run has ended, polling it."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from loopchat.chat.views.lens_view import lens_lines
from loopchat.chat.views.lines import lines_to_text


class LensScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f11,alt+l", "dismiss", "Back")]
    DEFAULT_CSS = """
    LensScreen { align: center middle; }
    LensScreen > VerticalScroll { width: 90; height: 90%; border: round $accent; padding: 0 1; background: $surface; }
    """

    def __init__(self, probe: Any, session: Any) -> None:
        super().__init__()
        self.probe, self.session = probe, session
        self.body = Static(id="lens-body")
        self.shown_done = False

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield self.body

    def on_mount(self) -> None:
        self._draw()
        self.set_interval(0.1, self._poll)

    def _poll(self) -> None:
        if self.probe.done and not self.shown_done:
            self._draw()

    def _draw(self) -> None:
        p = self.probe
        self.shown_done = p.done
        rec = self.session.conversation.reply(p.reply)
        self.body.update(lines_to_text(lens_lines(rec, p.step, p.rows, p.note, p.done)))

    @property
    def text(self) -> str:
        p = self.probe
        rec = self.session.conversation.reply(p.reply)
        return "\n".join("".join(s for s, _ in line) for line in lens_lines(rec, p.step, p.rows, p.note, p.done))
