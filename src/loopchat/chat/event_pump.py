"""The hand-over between the engine thread and the UI: a deque drained at frame rate.

The worker's `emit` runs on the engine thread for every event; all it does here is
`deque.append` (atomic, no lock, no Textual call). The app drains the deque on a timer
at FRAME_RATE and renders once per frame whatever arrived, so the UI's cost per token
stays small and does not depend on how fast the model runs.
"""

from __future__ import annotations

from collections import deque
from typing import Any

#: Frames per second at which the UI drains events and redraws. The loop panel should
#: update at least 15 times a second; Textual's timer drops a tick that comes a whole
#: interval late (a busy machine), so the rate leaves that margin. On 2 cores every ms
#: the UI spends is taken from the loop (docs/performance.md, "The frame").
FRAME_RATE = 16

#: A streaming reply's new tokens reach the transcript every TEXT_EVERY-th frame (8 times
#: a second): the loop panel shows every frame's latest pass, and text read by a person
#: needs no more; drawn every frame, it cost the UI thread more (docs/performance.md,
#: "The frame").
TEXT_EVERY = 2


class EventPump:
    def __init__(self) -> None:
        self._queue: deque[Any] = deque()

    def emit(self, event: Any) -> None:
        """Called on the engine thread: must stay this cheap."""
        self._queue.append(event)

    def drain(self) -> list[Any]:
        """Everything that arrived since the last call, oldest first (UI thread)."""
        q = self._queue
        out = []
        pop = q.popleft
        while q:
            out.append(pop())
        return out

    def snapshot(self) -> list[Any]:
        """A copy of what is waiting (list() of a deque is atomic under the GIL)."""
        return list(self._queue)

    def __len__(self) -> int:
        return len(self._queue)
