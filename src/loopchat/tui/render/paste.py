"""A bracketed paste read whole, in order, whatever it holds (Textual's input parser, private).

Textual 8.2.8's `XTermParser` keeps a bracketed paste (ESC[200~ ... ESC[201~) in a
buffer, but an ESC inside the paste (a pasted colour code, a log line...) sends it back
to reading an escape sequence: the characters after that ESC come out as key presses,
before the Paste event that holds the characters before it (`A1 [ESC[31mred] B2` arrived
as the keys `^[31mred] B2`, then the paste `A1 [`), and a pasted line break among them
is an Enter. `PasteParser` reads a paste itself: from the start marker to the end marker,
every character is the paste's, and one Paste event carries them all. Everything else
goes to Textual's parser unchanged (an ESC and what follows it are held back only while
they could still be the start marker, at most Textual's own escape delay).

`PasteDriver` is Textual's Linux driver reading its input through it (`run_input_thread`
is Textual's, with the parser swapped). Used only on the tested Textual (render/__init__).
"""

from __future__ import annotations

import os
import selectors
from codecs import getincrementaldecoder
from collections.abc import Callable, Generator
from typing import Any

from textual import constants, events
from textual._loop import loop_last
from textual._parser import ParseEOF, ParseError, ParseTimeout, Read1
from textual._xterm_parser import BRACKETED_PASTE_END, BRACKETED_PASTE_START, XTermParser
from textual.drivers.linux_driver import LinuxDriver

ESC = "\x1b"


def _send(inner: Generator[Any, str, None], text: str, want: Any) -> Any:
    """Hand `text` to Textual's parser, one character at a time; its next request."""
    for char in text:
        want = inner.send(char)
    return want


class PasteParser(XTermParser):
    def parse(self, token_callback: Callable[[Any], None]) -> Generator[Any, str, None]:
        inner = super().parse(token_callback)
        want = next(inner)  # what Textual's parser asks for next (a Read1, maybe with a timeout)
        held = ""  # an ESC and what followed it, while it may be the paste's start marker
        while True:
            try:
                char = yield (Read1(constants.ESCAPE_DELAY) if held else want)
            except ParseTimeout:  # nothing more came: held is a key (Esc...), not a paste
                want = _send(inner, held, want) if held else want
                held = ""
                if want.timeout is not None:  # Textual's parser waits on the same delay
                    want = inner.throw(ParseTimeout())
                continue
            except ParseEOF:
                try:
                    _send(inner, held, want)
                    inner.throw(ParseEOF())
                except StopIteration:
                    pass
                return
            if not held and char != ESC:
                want = inner.send(char)
                continue
            candidate = held + char
            if candidate == BRACKETED_PASTE_START:
                held = ""
                if want.timeout is not None:  # an escape before the paste: resolved first
                    want = inner.throw(ParseTimeout())
                text, ended = yield from self._read_paste()
                token_callback(events.Paste(text))
                if ended:
                    return
            elif BRACKETED_PASTE_START.startswith(candidate):
                held = candidate
            else:  # not a paste: Textual's parser reads it (an ESC that follows starts again)
                held = ESC if char == ESC else ""
                want = _send(inner, candidate[:-1] if char == ESC else candidate, want)

    def _read_paste(self) -> Generator[Any, str, tuple[str, bool]]:
        """The paste's characters up to the end marker: (text, the input ended)."""
        chars: list[str] = []
        end = BRACKETED_PASTE_END
        while True:
            try:
                char = yield Read1()
            except ParseEOF:
                return "".join(chars).replace("\x00", ""), True
            chars.append(char)
            if char == end[-1] and "".join(chars[-len(end) :]) == end:
                del chars[-len(end) :]
                return "".join(chars).replace("\x00", ""), False  # (NUL: as Textual drops it)


class PasteDriver(LinuxDriver):
    def run_input_thread(self) -> None:
        """Textual 8.2.8's `LinuxDriver.run_input_thread`, reading through PasteParser."""
        selector = selectors.SelectSelector()
        selector.register(self.fileno, selectors.EVENT_READ)
        fileno = self.fileno
        parser = PasteParser(self._debug)
        feed, tick = parser.feed, parser.tick
        decode = getincrementaldecoder("utf-8")().decode

        def process_selector_events(selector_events: list, final: bool = False) -> None:
            for last, (_key, mask) in loop_last(selector_events):
                if mask & selectors.EVENT_READ:
                    unicode_data = decode(os.read(fileno, 1024 * 4), final=final and last)
                    if not unicode_data:
                        break
                    for event in feed(unicode_data):
                        self.process_message(event)
            for event in tick():
                self.process_message(event)

        try:
            while not self.exit_event.is_set():
                process_selector_events(selector.select(0.1))
            selector.unregister(self.fileno)
            process_selector_events(selector.select(0.1), final=True)
        finally:
            selector.close()
            try:
                for _event in feed(""):
                    pass
            except (EOFError, ParseError):
                pass
