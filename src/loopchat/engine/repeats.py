"""The reply repeating itself: the same run of tokens again (issue 22).

A pure, incremental detector over a reply's token ids. Definition (docs/trace-format.md,
"repeat"): after token i of the reply (0-based, the prefix of a branch included), let
g be its last MIN_TOKENS tokens, t[i-MIN_TOKENS+1 .. i]. The reply is repeating at i when
g also occurs earlier in the reply, starting before i-MIN_TOKENS+1 (the two may
overlap). Then

- `period` d is the distance to the latest earlier occurrence (the smallest d >= 1 with
  t[k] == t[k-d] for every k of g);
- `start` s is the first token of the longest run ending at i in which every token
  equals the one d before it (t[k] == t[k-d] for s <= k <= i): the tokens s..i repeat
  the tokens s-d..i-d.

A 40-token phrase said at tokens 261-300 (1-based, as shown) and again from token 301
reads, at token 340, as start 300, period 40 (0-based): "repeating: tokens 301–340 repeat
261–300"; if it goes on saying it, at token 512: "tokens 301–512 repeat 261–472".

Cost per token: one dict lookup of a MIN_TOKENS-tuple; where a run begins or its period
changes, a walk back over the tokens that run holds. Never a pass over the whole reply
at every token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: the shortest run of tokens that counts as a repeat
MIN_TOKENS = 8


@dataclass(frozen=True, slots=True)
class Repeat:
    """Tokens start..end (0-based, inclusive) of the reply equal tokens start-period..end-period."""

    start: int
    end: int
    period: int

    @property
    def length(self) -> int:
        return self.end - self.start + 1

    @property
    def earlier(self) -> tuple[int, int]:
        return self.start - self.period, self.end - self.period

    def describe(self) -> str:
        """'repeating: tokens 301–340 repeat 261–300' (1-based, as the document view counts)."""
        a, b = self.earlier
        text = f"repeating: tokens {self.start + 1}–{self.end + 1} repeat {a + 1}–{b + 1}"
        if self.length > self.period:  # the run repeats itself: a loop of `period` tokens
            text += f" (loop of {self.period} tokens)"
        return text

    def as_tuple(self) -> tuple[int, int]:
        """(start, period): what a Step carries (its end is the step's index)."""
        return self.start, self.period


class RepeatFinder:
    """Feed a reply's tokens one by one; each `feed` says whether the reply is repeating."""

    def __init__(self, tokens: Iterable[int] = (), min_tokens: int = MIN_TOKENS) -> None:
        self.n = min_tokens
        self.tokens: list[int] = []
        self._last_end: dict[tuple[int, ...], int] = {}  # a window's latest end position
        self.current: Repeat | None = None
        for t in tokens:
            self.feed(t)

    def feed(self, token: int) -> Repeat | None:
        t = self.tokens
        t.append(int(token))
        i = len(t) - 1
        prev, self.current = self.current, None
        if i + 1 < self.n:
            return None
        key = tuple(t[i - self.n + 1 :])
        e = self._last_end.get(key)
        self._last_end[key] = i
        if e is None:
            return None
        d = i - e
        if prev is not None and prev.period == d and prev.end == i - 1:
            s = prev.start
        else:
            s = i - self.n + 1
            while s - 1 - d >= 0 and t[s - 1] == t[s - 1 - d]:
                s -= 1
        self.current = Repeat(s, i, d)
        return self.current


def repeat_of_step(index: int, value: Sequence[int] | None) -> Repeat | None:
    """The Repeat a Step's `repeat` field (start, period) stands for, at step `index`."""
    if not value:
        return None
    return Repeat(int(value[0]), index, int(value[1]))


def longest_repeat(tokens: Iterable[int], min_tokens: int = MIN_TOKENS) -> Repeat | None:
    """The longest run the detector reports over a whole reply (the first of equal ones)."""
    finder = RepeatFinder(min_tokens=min_tokens)
    best: Repeat | None = None
    for tok in tokens:
        r = finder.feed(tok)
        if r is not None and (best is None or r.length > best.length):
            best = r
    return best


def longest_of(marks: Iterable[tuple[int, Sequence[int] | None]]) -> Repeat | None:
    """The longest repeat among steps' (index, Step.repeat) pairs (the first of equal
    ones): what a finished reply's info line reports."""
    best: Repeat | None = None
    for index, value in marks:
        r = repeat_of_step(index, value)
        if r is not None and (best is None or r.length > best.length):
            best = r
    return best
