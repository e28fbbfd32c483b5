"""serve/handoff.py: the engine thread hands its events to the event loop without waiting
for the loop's thread (no model: OneLoop's worker has none loaded; the events are plain objects)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from loopchat.serve import handoff as handoff_module
from loopchat.serve.handoff import Handoff
from loopchat.serve.loop import OneLoop

#: the C functions the engine thread's emit may call: none of them lets go of the GIL
#: (deque.append is C code that never does; `__exit__` is the wake-up lock's release, the
#: lock taken only against close(); the wake-up's write is a ctypes PyDLL function, which
#: sys.setprofile does not report: its flag is checked below)
HOLDS_THE_GIL = {"isinstance", "append", "__exit__"}


@contextlib.contextmanager
def counted_writes() -> Iterator[list[int]]:
    """The hand-off's wake-up writes while inside: each one's descriptor, listed (and made)."""
    writes: list[int] = []
    real = handoff_module._write

    def counting(fd: int, data: bytes, n: int) -> int:
        writes.append(fd)
        return int(real(fd, data, n))

    handoff_module._write = counting  # type: ignore[assignment]
    try:
        yield writes
    finally:
        handoff_module._write = real  # type: ignore[assignment]


class Arrivals:
    """What a Handoff dispatched, in order, and a wait for the loop to have taken so many."""

    def __init__(self) -> None:
        self.got: list[int] = []
        self._arrived = asyncio.Event()

    def dispatch(self, event: int) -> None:
        self.got.append(event)
        self._arrived.set()

    async def until(self, n: int) -> None:
        while len(self.got) < n:
            await asyncio.wait_for(self._arrived.wait(), 30)
            self._arrived.clear()


def test_the_engine_thread_emits_without_letting_go_of_the_gil():
    """Each token's Step is emitted on the engine thread just before its next forward
    pass. Before, `call_soon_threadsafe` wrote to the event loop's self-pipe (a socket
    `send`, which lets go of the GIL): the woken event loop could take the GIL and
    serialize and send the chunk (~0.6 ms) while the engine thread waited to take it back,
    the pass not started (on a loaded machine, 5% of the engine thread's time, measured
    with py-spy: docs/performance.md). Now the emit calls only C code that keeps the GIL,
    and wakes the event loop itself with a write that keeps it too (no hand-off thread)."""
    one = OneLoop()
    called: list[str] = []
    emitted = threading.Event()

    def profile(frame, event, arg):  # (sys.setprofile's hook: the C functions called)
        if event == "c_call" and arg is not sys.setprofile:
            called.append(arg.__name__)

    def engine_thread() -> None:
        sys.setprofile(profile)
        try:
            for i in range(3):
                one._emit(i)  # the worker's callback, as the engine thread calls it
        finally:
            sys.setprofile(None)
            emitted.set()

    async def main() -> None:
        one.attach()
        try:
            threading.Thread(target=engine_thread, daemon=True).start()
            deadline = time.monotonic() + 30
            while not emitted.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        finally:
            one.detach()

    try:
        asyncio.run(main())
    finally:
        one.close()
    assert emitted.is_set()
    assert "append" in called
    assert set(called) <= HOLDS_THE_GIL, f"the emit called {sorted(set(called) - HOLDS_THE_GIL)}"
    # the wake-up's write: a PyDLL function (ctypes calls it without letting go of the GIL)
    assert handoff_module._write._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # type: ignore[attr-defined]


def test_the_loop_is_woken_once_for_what_queued_up_meanwhile():
    """The engine thread writes the wake-up descriptor only when the loop has taken every
    event since its last wake-up: a pass's events (or a burst) cost one write, one wake-up."""
    got: list[int] = []

    async def main() -> None:
        arrived = asyncio.Event()

        def dispatch(event: int) -> None:
            got.append(event)
            if event in (4, 5):
                arrived.set()

        handoff = Handoff(asyncio.get_running_loop(), dispatch)
        try:
            for i in range(5):
                handoff.put(i)  # (the loop does not run meanwhile: one wake-up for all five)
            await asyncio.wait_for(arrived.wait(), 30)
            arrived.clear()
            handoff.put(5)
            await asyncio.wait_for(arrived.wait(), 30)
        finally:
            handoff.close()
        handoff.put(6)  # after close: dropped, never written anywhere

    with counted_writes() as writes:
        asyncio.run(main())
    assert got == [0, 1, 2, 3, 4, 5]
    assert len(writes) == 2


def test_events_arrive_on_the_loop_thread_whole_and_in_order():
    got: list[int] = []
    threads: set[int] = set()

    def dispatch(event: int) -> None:
        threads.add(threading.get_ident())
        got.append(event)

    async def main() -> None:
        handoff = Handoff(asyncio.get_running_loop(), dispatch)
        sender = threading.Thread(target=lambda: [handoff.put(i) for i in range(3000)], daemon=True)
        sender.start()
        deadline = time.monotonic() + 30
        while len(got) < 3000 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        handoff.close()
        sender.join(5)

    asyncio.run(main())
    assert got == list(range(3000))
    assert threads == {threading.get_ident()}  # asyncio.run's loop runs on this thread


def test_a_wake_up_left_to_the_pass_is_made_by_it_or_by_the_next_put():
    """A shared batch's tokens are put with the wake-up left to the pass (`soon`): no write
    until `pay` (the engine thread, right before llama_decode: engine/pass_hook.py) or the
    next plain put; one write for all of them; nothing owed once the loop took them."""
    arrivals = Arrivals()

    async def main(writes: list[int]) -> None:
        handoff = Handoff(asyncio.get_running_loop(), arrivals.dispatch)
        try:
            handoff.put(0, soon=True)
            assert writes == []
            handoff.pay()  # (the decode)
            handoff.pay()  # (nothing owed any more)
            assert len(writes) == 1
            await arrivals.until(1)
            handoff.put(1, soon=True)
            handoff.put(9, soon=True)  # (no decode paid the last: never left owed past one pass)
            assert len(writes) == 2
            await arrivals.until(3)
            arrivals.got.remove(9)
            handoff.put(2, soon=True)
            handoff.put(3)  # (a plain put pays what is owed: one write)
            assert len(writes) == 3
            await arrivals.until(4)  # (2 and 3 came in one wake-up)
            handoff.pay()  # (the loop took them: nothing owed)
            assert len(writes) == 3
        finally:
            handoff.close()

    with counted_writes() as writes:
        asyncio.run(main(writes))
    assert arrivals.got == [0, 1, 2, 3]


def test_a_wake_up_lent_to_the_decode_is_the_loops_wake_up():
    """With the kernel, the pass's decode writes the descriptor itself once it has let go of
    the GIL (`lend`, engine/pass_hook.py): the wake-up owed is lent once, counted as made (a
    put meanwhile writes nothing), and the events arrive on that write."""
    arrivals = Arrivals()

    async def main(writes: list[int]) -> None:
        handoff = Handoff(asyncio.get_running_loop(), arrivals.dispatch)
        try:
            assert handoff.lend() == -1  # (nothing owed)
            handoff.put(0, soon=True)
            fd = handoff.lend()
            assert fd >= 0 and handoff.lend() == -1  # (lent once)
            handoff.put(1)  # (the loop counts as woken: no write of its own)
            assert writes == []
            os.write(fd, (1).to_bytes(8, "little"))  # (the decode's write)
            handoff.settle()
            await arrivals.until(2)
        finally:
            handoff.close()

    with counted_writes() as writes:
        asyncio.run(main(writes))
    assert arrivals.got == [0, 1]


def test_a_close_while_the_descriptor_is_lent_waits_for_the_decode():
    """The server stops during a pass that was lent the descriptor: it stays open (the decode
    may still write it: a number closed and reused would be some other file's) until the
    decode is settled, then closes; nothing is lent after the close."""

    async def main() -> None:
        handoff = Handoff(asyncio.get_running_loop(), lambda event: None)
        handoff.put(0, soon=True)
        fd = handoff.lend()
        handoff.close()
        os.fstat(fd)  # (still open)
        os.write(fd, (1).to_bytes(8, "little"))  # (the decode's write, after the close)
        handoff.settle()
        with pytest.raises(OSError):
            os.fstat(fd)
        handoff.put(1, soon=True)
        assert handoff.lend() == -1

    asyncio.run(main())
