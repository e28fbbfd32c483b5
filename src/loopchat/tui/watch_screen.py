"""The palette's "Tokens on watch": the user's own tokens, followed at every pass of the
next replies (watch.py). One line of strings, shell-quoted where they hold a space
(`" Paris" " London"`); Enter sets them (empty: nothing on watch), Esc leaves them."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from loopchat.watch import MAX_WATCH, WatchError, parse_watch, watch_line


class WatchScreen(ModalScreen[tuple[str, ...] | None]):
    BINDINGS = [Binding("escape", "cancel", show=False)]
    DEFAULT_CSS = """
    WatchScreen { align: center middle; }
    WatchScreen > Vertical { width: 80; height: auto; border: round $accent; padding: 0 1; background: $surface; }
    WatchScreen .hint { color: $text-muted; }
    WatchScreen #watch-error { color: $error; }
    """

    def __init__(self, watch: tuple[str, ...]) -> None:
        super().__init__()
        self.given = watch

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Tokens on watch"
            yield Input(value=watch_line(self.given), id="watch-line")
            yield Static("", id="watch-error")
            yield Static(
                f'Up to {MAX_WATCH} texts, quoted where they hold a space: " Paris" " London" Berlin. Each one\'s '
                "first token is followed at every pass of the next replies: its probability and rank, raw and "
                "after sampling, in the panel. Enter: set (empty: none) · Esc: leave them",
                classes="hint",
            )

    def on_mount(self) -> None:
        self.query_one("#watch-line", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            watch = parse_watch(event.value)
        except WatchError as exc:
            self.query_one("#watch-error", Static).update(str(exc))
            return
        self.dismiss(watch)

    def action_cancel(self) -> None:
        self.dismiss(None)
