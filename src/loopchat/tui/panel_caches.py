"""What the loop panel keeps from one frame to the next, so that a frame costs the new
steps, not the reply so far: the reply's index (setting changes, pass times and the
sparkline's maxima, updated with the new steps only) and the fitted settings block.
A remote reply whose server sends no pass times has its arrival gaps there instead.
"""

from __future__ import annotations

import bisect

from .conversation import ReplyRecord
from .fast_static import Line

_SPARK_BLOCKS = 64  # the whole-reply sparkline is drawn from at most 2x this many maxima


class ReplyIndex:
    """Incremental per-record caches, so a frame costs the new steps, not the reply:
    last change step per setting, decode forward times, their min/max, and the maxima
    of consecutive blocks of them (blocks double in size as the reply grows)."""

    __slots__ = ("record", "seen", "changes", "threads", "forward", "fmin", "fmax", "blocks", "block", "fill", "arrivals")

    def __init__(self, record: ReplyRecord) -> None:
        self.record = record
        self.seen = 0
        self.changes: dict[str, int] = {}
        self.threads: list[tuple[int, str]] = []  # (step index, reason) where the thread count's reason changed
        self.forward: list[float] = []  # forward_ms of steps[1:] (arrival_ms where it is not given)
        self.arrivals = False  # the reply's pass times are not given: `forward` holds arrival gaps
        self.fmin = float("inf")
        self.fmax = 0.0
        self.blocks: list[float] = []
        self.block = 1  # forward passes per block
        self.fill = 0  # passes in the last (open) block

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
        for x in steps[max(1, self.seen) :]:
            if x.forward_ms is not None:
                self._add(x.forward_ms)
            elif x.arrival_ms is not None:
                self.arrivals = True
                self._add(x.arrival_ms)
        self.seen = n

    def threads_reason(self, index: int) -> tuple[int, str] | None:
        """The last (step index, reason) of the thread count at or before step `index`."""
        notes = self.threads
        i = bisect.bisect_right(notes, index, key=lambda n: n[0])
        return notes[i - 1] if i else None

    def _add(self, v: float) -> None:
        self.forward.append(v)
        self.fmin = min(self.fmin, v)
        self.fmax = max(self.fmax, v)
        if self.fill == 0:
            self.blocks.append(v)
        elif v > self.blocks[-1]:
            self.blocks[-1] = v
        self.fill += 1
        if self.fill == self.block:
            self.fill = 0
            if len(self.blocks) == 2 * _SPARK_BLOCKS:
                b = self.blocks
                self.blocks = [max(b[i], b[i + 1]) for i in range(0, len(b), 2)]
                self.block *= 2


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
