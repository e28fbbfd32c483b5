"""The prompt: a multi-line editor where Enter sends and Ctrl+J / Alt+Enter break the line.

A pasted block keeps its newlines (a terminal's bracketed paste arrives as one Paste
event, which TextArea inserts whole). The box grows with its text up to a few lines
(`max-height` in styles.tcss), then scrolls.
"""

from __future__ import annotations

from rich.segment import Segment
from textual import events
from textual.actions import parse
from textual.binding import Binding
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import TextArea

from loopchat.chat.plots import visible_controls

#: Keys that insert a line break. Every terminal sends Ctrl+J as a plain line feed.
#: Alt+Enter and Shift+Enter reach the app only from terminals that report modified keys
#: (the kitty keyboard protocol); elsewhere they arrive as a plain Enter, which sends.
NEWLINE_KEYS = ("ctrl+j", "alt+enter", "shift+enter")

#: TextArea's editing and cursor keys (Backspace, Delete, Ctrl+W, the arrows...): run at
#: once, in order with the characters around them (see `on_key`), key -> (action, args)
IMMEDIATE_KEYS: dict[str, tuple[str, tuple]] = {
    key.strip(): (name, args)
    for binding in TextArea.BINDINGS
    if isinstance(binding, Binding)
    for _, name, args in [parse(binding.action)]
    if name.startswith(("delete_", "cursor_"))
    for key in binding.key.split(",")
}

#: Keys that scroll the transcript (or the document view, when it shows) from the message
#: box: key -> how (PromptArea.ScrollRequested). TextArea's own PgUp/PgDn move its cursor
#: by a page of a box a few lines high; its arrows, Shift+arrows, Home/End stay its own.
SCROLL_KEYS = {"pageup": "page_up", "pagedown": "page_down", "ctrl+home": "home", "ctrl+end": "end"}


class TypedForTheBox(Message):
    """A character (or Enter) typed while a widget that takes no text had the focus (a
    click on a token gives it to the transcript; Ctrl+T to the document): it belongs to
    the message box, or, in step mode, to the die bar."""

    def __init__(self, key: str, text: str) -> None:
        super().__init__()
        self.key = key
        self.text = text

    @classmethod
    def hand_over(cls, event: events.Key, widget: Widget) -> None:
        """From `widget`'s on_key: a typed character or Enter goes on as this message
        (and no further as a key); other keys are left to the widget's bindings."""
        if event.key == "enter":
            typed = cls("enter", "")
        elif event.is_printable and event.character:
            typed = cls(event.key, event.character)
        else:
            return
        event.stop()
        event.prevent_default()
        widget.post_message(typed)


class PromptArea(TextArea):
    """Posts `PromptArea.Submitted` on Enter; the app decides what to do with the text."""

    class Submitted(Message):
        def __init__(self, prompt: PromptArea, text: str) -> None:
            super().__init__()
            self.prompt = prompt
            self.text = text

    class ScrollRequested(Message):
        """A scroll key (SCROLL_KEYS) pressed in the box: `how` is page_up, page_down,
        home or end."""

        def __init__(self, how: str) -> None:
            super().__init__()
            self.how = how

    def __init__(self, *, placeholder: str = "", id: str | None = None) -> None:
        super().__init__(
            "",
            id=id,
            soft_wrap=True,
            show_line_numbers=False,
            tab_behavior="focus",
            compact=True,
            highlight_cursor_line=False,
            placeholder=placeholder,
        )

    # the app reads and writes the draft through these (like Input.value)
    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    def render_line(self, y: int) -> Strip:
        """TextArea's line, a control character in it drawn as a visible symbol (a pasted
        ESC would start a colour or move the cursor in the terminal); the text keeps it."""
        strip = super().render_line(y)
        shown = [Segment(visible_controls(s.text), s.style, s.control) for s in strip]
        if all(a.text == b.text for a, b in zip(shown, strip)):
            return strip
        return Strip(shown).crop(0, self.size.width)  # a symbol takes a cell an ESC did not

    def on_key(self, event: events.Key) -> None:
        # Handled here rather than as bindings: a binding's action runs after the keys
        # that arrived in the same read from the terminal ("abc", Ctrl+J, "def" typed
        # fast or sent by a script), so the line break landed after "def". Textual
        # calls this before TextArea's own key handler, which prevent_default() skips.
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.action_submit()
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.action_newline()
            return
        if event.key.startswith("alt+") and event.is_printable:
            # Alt+N, Alt+R (a browser tab's keys) arrive as ("alt+n", "n"): not text for
            # TextArea to type, but keys for the app's bindings
            event.prevent_default()
            return
        if event.key in SCROLL_KEYS:
            event.stop()
            event.prevent_default()
            self.post_message(self.ScrollRequested(SCROLL_KEYS[event.key]))
            return
        immediate = IMMEDIATE_KEYS.get(event.key)
        if immediate is not None:  # the same for TextArea's editing keys (Backspace...)
            event.stop()
            event.prevent_default()
            name, args = immediate
            getattr(self, f"action_{name}")(*args)

    def action_submit(self) -> None:
        """What Enter does: offer the text to the app."""
        self.post_message(self.Submitted(self, self.text))

    def action_newline(self) -> None:
        # like typing a character: replaces the selection, the cursor ends after it
        result = self.replace("\n", *self.selection)
        self.move_cursor(result.end_location)
