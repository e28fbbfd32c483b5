"""Ctrl+O: the stored conversations, newest first, with a search box over their text.

Enter (or a click) opens one, Ctrl+R renames it, Ctrl+D deletes it after a
confirmation, Esc closes the list. The list is read through its own connection to the
store (reads only); renames and deletes go through the app's StoreWriter (its thread),
and the list shows them at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from loopchat.history.store import ConversationStore, ConversationSummary, StoreError

_BOX_CSS = """
    align: center middle;
    & > Vertical {
        width: 100;
        max-width: 100%;
        height: auto;
        max-height: 90%;
        border: thick $primary;
        border-title-color: $text-primary;
        background: $surface;
        padding: 0 1;
    }
    & .hint { color: $text-muted; }
"""


def summary_label(s: ConversationSummary) -> Text:
    """Title, then model · date · replies (· cut)."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.updated))
    replies = f"{s.replies} repl{'y' if s.replies == 1 else 'ies'}"
    if s.cut:
        replies += f" · {s.cut} cut"
    text = Text(s.title or "(untitled)", style="bold", no_wrap=True, overflow="ellipsis")
    text.append(f"\n{s.model_name or 'unknown model'} · {when} · {replies}", style="dim")
    return text


class HistoryScreen(ModalScreen[int | None]):
    """Dismissed with the id of the conversation to open (None: closed)."""

    BINDINGS = [
        Binding("escape", "close", "Close", show=False),
        Binding("up", "move(-1)", show=False, priority=True),
        Binding("down", "move(1)", show=False, priority=True),
        Binding("ctrl+r", "rename", "Rename", priority=True),
        # priority: the search box would take Ctrl+D as delete-right (Delete does that too)
        Binding("ctrl+d", "delete", "Delete", priority=True),
    ]

    DEFAULT_CSS = "HistoryScreen {" + _BOX_CSS + "} HistoryScreen OptionList { height: auto; max-height: 30; }"

    def __init__(
        self,
        store_path: Path,
        *,
        rename: Callable[[int, str], None],
        delete: Callable[[int], None],
        current: int | None = None,
    ) -> None:
        super().__init__()
        self.store_path = store_path
        self._rename = rename
        self._delete = delete
        self.current = current  # the conversation on screen (marked in the list)
        self.summaries: list[ConversationSummary] = []
        self._store: ConversationStore | None = None

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Conversations"
            yield Input(placeholder="Search the conversations' text…", id="history-search")
            yield OptionList(id="history-list")
            yield Static(
                "Enter: open (the current one is replaced) · Ctrl+R: rename · Ctrl+D: delete · Esc: close",
                classes="hint",
            )

    @property
    def options(self) -> OptionList:
        return self.query_one("#history-list", OptionList)

    def on_mount(self) -> None:
        try:
            self._store = ConversationStore.open_reader(self.store_path)
        except StoreError as exc:
            self.app.notify(str(exc), severity="error", timeout=10)
            self.dismiss(None)
            return
        self.show_list("")
        self.query_one("#history-search", Input).focus()

    def on_unmount(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def show_list(self, search: str) -> None:
        if self._store is None:
            return
        try:
            self.summaries = self._store.list_conversations(search)
        except StoreError as exc:
            self.app.notify(str(exc), severity="error", timeout=10)
            self.summaries = []
        self._fill()

    def _fill(self) -> None:
        ol = self.options
        ol.clear_options()
        if not self.summaries:
            search = self.query_one("#history-search", Input).value
            ol.add_option(
                Option(
                    Text("No conversation matches" if search else "No conversation stored yet", style="dim"),
                    disabled=True,
                )
            )
            return
        for s in self.summaries:
            label = summary_label(s)
            if s.id == self.current:
                label.append("  (on screen)", style="italic")
            ol.add_option(Option(label, id=str(s.id)))
        ol.highlighted = 0

    def selected(self) -> ConversationSummary | None:
        i = self.options.highlighted
        if i is None or not self.summaries or not 0 <= i < len(self.summaries):
            return None
        return self.summaries[i]

    # ---- events and keys -----------------------------------------------------------
    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "history-search":
            self.show_list(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "history-search":
            event.stop()
            self._open()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self._open()

    def _open(self) -> None:
        s = self.selected()
        if s is not None:
            self.dismiss(s.id)

    def action_close(self) -> None:
        self.dismiss(None)

    def action_move(self, by: int) -> None:
        ol = self.options
        if self.summaries:
            ol.highlighted = max(0, min(len(self.summaries) - 1, (ol.highlighted or 0) + by))

    def _selected_for(self, what: str) -> ConversationSummary | None:
        """The highlighted conversation, or None with a notice saying why nothing happens."""
        s = self.selected()
        if s is None:
            if self.summaries:
                empty = "no conversation is highlighted"
            elif self.query_one("#history-search", Input).value:
                empty = "no conversation matches the search"
            else:
                empty = "no conversation is stored"
            self.app.notify(f"Nothing to {what}: {empty}", timeout=2)
        return s

    def action_rename(self) -> None:
        s = self._selected_for("rename")
        if s is None:
            return

        def done(title: str | None) -> None:
            if title:
                self._rename(s.id, title)
                i = self.summaries.index(s)
                self.summaries[i] = _replace(s, title=title)
                self._fill()
                self.options.highlighted = i

        self.app.push_screen(RenameScreen(s.title), done)

    def action_delete(self) -> None:
        s = self._selected_for("delete")
        if s is None:
            return

        def done(yes: bool | None) -> None:
            if yes:
                self._delete(s.id)
                self.summaries.remove(s)
                self._fill()
                self.app.notify(f"Deleted “{s.title}”", timeout=2)

        self.app.push_screen(ConfirmDelete(s), done)


def _replace(s: ConversationSummary, **changes: Any) -> ConversationSummary:
    import dataclasses

    return dataclasses.replace(s, **changes)


class RenameScreen(ModalScreen[str | None]):
    """A conversation's new title: Enter keeps it, Esc leaves the old one."""

    BINDINGS = [Binding("escape", "cancel", show=False)]
    DEFAULT_CSS = "RenameScreen {" + _BOX_CSS + "}"

    def __init__(self, title: str) -> None:
        super().__init__()
        self.old = title

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Rename the conversation"
            yield Input(value=self.old, id="rename-title")
            yield Static("Enter: rename · Esc: keep the old title", classes="hint")

    def on_mount(self) -> None:
        self.query_one("#rename-title", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        title = " ".join(event.value.split())
        if not title:
            self.notify("A title cannot be empty: type one, or Esc keeps the old title", severity="warning")
            return
        self.dismiss(title)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmDelete(ModalScreen[bool]):
    """y deletes, n or Esc keeps."""

    BINDINGS = [
        Binding("y", "answer(True)", show=False),
        Binding("n,escape", "answer(False)", show=False),
    ]
    DEFAULT_CSS = "ConfirmDelete {" + _BOX_CSS + "}"

    def __init__(self, summary: ConversationSummary) -> None:
        super().__init__()
        self.summary = summary

    def compose(self) -> ComposeResult:
        s = self.summary
        with Vertical() as box:
            box.border_title = "Delete the conversation?"
            yield Static(
                Text.assemble(
                    "Delete “",
                    (s.title, "bold"),
                    f"” and its {s.replies} repl{'y' if s.replies == 1 else 'ies'} "
                    "with every step? This cannot be undone.",
                )
            )
            yield Static("y: delete · n or Esc: keep it", classes="hint")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
