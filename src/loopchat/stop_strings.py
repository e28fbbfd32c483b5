"""Stop strings: the reply ends before the first occurrence of any of them.

The engine feeds each step's text through a `StopStrings`; what could still be the start
of a stop string is held back until the next steps tell (it then goes out with a later
step's text, or is cut off with the stop string), so no part of a stop string is ever
sent. The steps' texts still add up to the reply's text.
"""

from __future__ import annotations

from collections.abc import Sequence

#: OpenAI's limit on the number of stop sequences.
MAX_STOP_STRINGS = 4


class StopStrings:
    """Holds back, releases and cuts the text of one reply."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.held = ""
        self._longest = max((len(s) for s in self.stops), default=0)

    def feed(self, text: str, final: bool = False) -> tuple[str, bool]:
        """The text this step may add to the reply, and whether a stop string ended it.
        `final`: the reply ends at this step anyway: release everything held."""
        buf = self.held + text
        found = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if found:
            self.held = ""
            return buf[: min(found)], True
        if final:
            self.held = ""
            return buf, False
        keep = self._prefix_tail(buf)
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def _prefix_tail(self, buf: str) -> int:
        """The length of the longest end of `buf` that begins some stop string."""
        for k in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0
