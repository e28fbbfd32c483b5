"""Server-sent events out of a byte stream, each with its exact bytes on the wire.

An event is the lines up to a blank line (a line ends with CRLF, LF or CR); its `data`
is the values of its `data:` lines joined with newlines (one space after the colon is
dropped), as the WHATWG event-stream rules say. Comment lines (`: ping`) and other fields
(`event:`, `id:`, `retry:`) are kept in the event's text but are not data. The wire view
shows `text`; `nbytes` counts the event's own bytes and the blank line that ends it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_EOL = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SSEEvent:
    text: str  # the event's lines as received (joined by "\n"), without the blank line
    data: str | None  # None: no data field (a comment such as a keep-alive ping)
    nbytes: int  # its bytes on the wire, the ending blank line included


class SSESplitter:
    """Feed it the bytes as they arrive; it returns the events they complete."""

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0  # where the next line starts
        self._start = 0  # where the current event starts
        self._lines: list[bytes] = []
        self.first = True  # a UTF-8 byte order mark may open the stream

    def feed(self, data: bytes) -> list[SSEEvent]:
        if not data:
            return []
        buf = self._buf + data if self._buf else data
        if self.first and len(buf) >= 3:
            self.first = False
            if buf.startswith(b"\xef\xbb\xbf"):
                buf = buf[3:]
        out: list[SSEEvent] = []
        pos, start, lines = self._pos, self._start, self._lines
        while True:
            m = _EOL.search(buf, pos)
            if m is None:
                break
            if m.end() == len(buf) and m.group() == b"\r":
                break  # perhaps the first half of CRLF: wait for the next byte
            line = buf[pos : m.start()]
            pos = m.end()
            if line:
                lines.append(line)
                continue
            if lines:  # a blank line ends an event
                out.append(_event(lines, pos - start))
                lines = []
            start = pos
        self._buf, self._pos, self._start, self._lines = buf[start:], pos - start, 0, lines
        return out

    def pending(self) -> bytes:
        """Bytes received that no blank line has ended yet (what a cut stream left)."""
        return self._buf


def _event(lines: list[bytes], nbytes: int) -> SSEEvent:
    data: list[str] = []
    texts = []
    for raw in lines:
        line = raw.decode("utf-8", errors="replace")
        texts.append(line)
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    return SSEEvent("\n".join(texts), "\n".join(data) if data else None, nbytes)


__all__ = ["SSEEvent", "SSESplitter"]
