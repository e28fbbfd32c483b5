"""A reply's text, step by step (a collaborator of the reply run): each token's bytes
through an incremental UTF-8 decoder (a character split between tokens goes to the token
that completes it) and the stop strings (stop_strings.py: text that may begin one is held
back). The steps' texts always join to the reply's text. Pure.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from loopchat.stop_strings import StopStrings


class ReplyText:
    def __init__(self, stop: Sequence[str] = (), prefix: bytes = b"") -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        if prefix:  # a branch: a character the prefix began is completed by this run's first token
            self._decoder.decode(prefix)
        self._stops = StopStrings(stop) if stop else None
        self.parts: list[str] = []

    def feed(self, piece: bytes | None, ending: bool) -> tuple[str, bool]:
        """This step's text, and whether a stop string ended the reply. `piece`: the
        token's bytes (None: an end-of-generation token, no text); `ending`: the reply
        ends at this step, so it carries the bytes of a character never finished (as
        U+FFFD) and any text held back."""
        text = "" if piece is None else self._decoder.decode(piece)
        if ending:
            text += self._decoder.decode(b"", final=True)
        stopped = False
        if self._stops is not None:
            text, stopped = self._stops.feed(text, final=ending)
        self.parts.append(text)
        return text, stopped

    def close(self) -> str:
        """The reply's text. A reply that ended after its last step was recorded (a cancel,
        a max_tokens change during the hand-over, a failed pass) leaves the bytes of an
        unfinished character, and text held back for a stop string, out of it."""
        self._decoder.decode(b"", final=True)
        return "".join(self.parts)
