"""Alt+V: the versions of a reply side by side, pass by pass (chat/views/versions.py lays them
out): a column per version, a row per pass from a few passes before they part, the pass where
they part marked, and what each drew there with its probabilities. Esc (or Alt+V) closes."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from loopchat.chat.views.versions import VersionsView


def versions_renderable(view: VersionsView) -> Table:
    table = Table(title=view.title, caption="\n".join([*view.parting, view.batch]).strip(), expand=True)
    table.add_column("pass", justify="right", no_wrap=True)
    for head in view.heads:
        table.add_column(head, overflow="fold")
    for index, cells, differs in view.rows:
        mark = "▶ " if index == view.parted_at else ""
        table.add_row(Text(f"{mark}{index + 1}"), *cells, style="bold" if differs else None)
    return table


class VersionsScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,alt+v", "dismiss", "Close")]
    DEFAULT_CSS = """
    VersionsScreen { align: center middle; }
    VersionsScreen > VerticalScroll { width: 96%; height: 90%; border: round $accent; background: $surface; }
    """

    def __init__(self, view: VersionsView) -> None:
        super().__init__()
        self.view = view

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(versions_renderable(self.view), id="versions")
