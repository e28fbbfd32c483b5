"""What the loop panel keeps from one frame to the next, so that a frame costs the new
steps, not the reply so far: the reply's index (setting changes, and the series its
sparklines draw: pass times, the drawn tokens' surprisal and the entropy, each with its
min/max and block maxima, updated with the new steps only) and the fitted settings block.
A remote reply whose server sends no pass times has its arrival gaps there instead.
"""

from __future__ import annotations

import bisect
import math

from loopchat.chat.conversation import ReplyRecord
from loopchat.chat.plots import sparkline
from loopchat.chat.views.lines import Line

_SPARK_BLOCKS = 64  # the whole-reply sparkline is drawn from at most 2x this many maxima


def surprisal(p: float | None) -> float | None:
    """Bits of surprise at drawing a token of probability `p` (None: not given; a
    probability that underflowed to 0: infinite)."""
    if p is None:
        return None
    return -math.log2(p) if p > 0 else math.inf


class Series:
    """One value per pass (None where it is not given), kept with its min, max, the
    position of its (first) max, and the maxima of consecutive blocks of passes: blocks
    double in size as the reply grows, so a sparkline of the whole reply is drawn from at
    most 2 x _SPARK_BLOCKS maxima. A block whose values are all missing is None (a gap)."""

    __slots__ = ("values", "lo", "hi", "peak", "blocks", "block", "fill", "_spark")

    def __init__(self) -> None:
        self.values: list[float | None] = []
        self.lo = math.inf
        self.hi = -math.inf
        self.peak: int | None = None  # position in `values` of the max (None: no value given)
        self.blocks: list[float | None] = []
        self.block = 1  # passes per block
        self.fill = 0  # passes in the last (open) block
        self._spark: tuple[tuple, str] | None = None  # (key, the last sparkline drawn of the blocks)

    def spark(self, width: int) -> str:
        """The sparkline of the blocks `width` cells wide, drawn again only when they changed
        (within one block size only the last block changes)."""
        key = (width, self.block, len(self.blocks), self.blocks[-1] if self.blocks else None)
        if self._spark is None or self._spark[0] != key:
            self._spark = (key, sparkline(self.blocks, width))
        return self._spark[1]

    def add(self, v: float | None) -> None:
        if v is not None:
            if v > self.hi:
                self.hi, self.peak = v, len(self.values)
            self.lo = min(self.lo, v)
        self.values.append(v)
        if self.fill == 0:
            self.blocks.append(v)
        elif v is not None and (self.blocks[-1] is None or v > self.blocks[-1]):
            self.blocks[-1] = v
        self.fill += 1
        if self.fill == self.block:
            self.fill = 0
            if len(self.blocks) == 2 * _SPARK_BLOCKS:
                b = self.blocks
                self.blocks = [_max(b[i], b[i + 1]) for i in range(0, len(b), 2)]
                self.block *= 2

    @property
    def given(self) -> bool:
        return self.peak is not None


def _max(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None or a >= b else b


class ReplyIndex:
    """Incremental per-record caches, so a frame costs the new steps, not the reply:
    last change step per setting, where the thread count's reason changed, and three
    series: decode forward times (steps[1:]; step 0's pass is the prefill), and over every
    step the drawn token's surprisal and the entropy, both of the raw softmax, in bits."""

    __slots__ = ("record", "seen", "changes", "threads", "latency", "arrivals", "surprisal", "entropy", "drafted")

    def __init__(self, record: ReplyRecord) -> None:
        self.record = record
        self.seen = 0
        self.changes: dict[str, int] = {}
        self.threads: list[tuple[int, str]] = []  # (step index, reason) where the thread count's reason changed
        self.latency = Series()  # forward_ms of steps[1:] (arrival_ms where it is not given)
        self.arrivals = False  # the reply's pass times are not given: `latency` holds arrival gaps
        self.surprisal = Series()  # -log2(raw_prob) of every step
        self.entropy = Series()  # raw_entropy of every step
        self.drafted = False  # some step came under a draft (a pass may have given several tokens)

    def update(self) -> None:
        steps = self.record.steps
        n = len(steps)
        if n < self.seen:  # the list was replaced: start again
            self.__init__(self.record)  # type: ignore[misc]
        for s in steps[self.seen :]:
            if s.threads_reason:
                self.threads.append((s.index, s.threads_reason))
            if s.index > 0:
                for name in s.settings_changed:
                    self.changes[name] = s.index
            self.surprisal.add(surprisal(s.raw_prob))
            self.entropy.add(s.raw_entropy)
            self.drafted = self.drafted or s.drafted is not None
        for x in steps[max(1, self.seen) :]:
            if x.forward_ms is not None:
                self.latency.add(x.forward_ms)
            elif x.arrival_ms is not None:
                self.arrivals = True
                self.latency.add(x.arrival_ms)
        self.seen = n

    def threads_reason(self, index: int) -> tuple[int, str] | None:
        """The last (step index, reason) of the thread count at or before step `index`."""
        notes = self.threads
        i = bisect.bisect_right(notes, index, key=lambda n: n[0])
        return notes[i - 1] if i else None


class PanelCaches:
    """What a panel keeps from one frame to the next: the index of the reply shown and
    the fitted settings block. Each LoopPanel has its own (two apps in one process share
    nothing); `panel_lines` without one starts from empty caches."""

    __slots__ = ("index", "settings")

    def __init__(self) -> None:
        self.index: ReplyIndex | None = None
        self.settings: tuple[tuple, list[Line]] | None = None  # (key, fitted lines)

    def record_index(self, r: ReplyRecord) -> ReplyIndex:
        if self.index is None or self.index.record is not r:
            self.index = ReplyIndex(r)
        self.index.update()
        return self.index

    def changes(self, r: ReplyRecord | None) -> dict[str, int]:
        return self.record_index(r).changes if r is not None else {}
