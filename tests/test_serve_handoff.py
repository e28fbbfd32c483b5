"""serve/handoff.py: the engine thread hands its events to the event loop without waiting
for the loop's thread (no model: OneLoop's worker has none loaded; the events are plain objects)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

from loopchat.serve.handoff import Handoff
from loopchat.serve.loop import OneLoop

#: the C functions the engine thread's emit may call: none of them lets go of the GIL
#: (SimpleQueue.put is C code that never does)
HOLDS_THE_GIL = {"isinstance", "put"}


def test_the_engine_thread_emits_without_letting_go_of_the_gil():
    """Each token's Step is emitted on the engine thread just before its next forward
    pass. Before, `call_soon_threadsafe` wrote to the event loop's self-pipe (a socket
    `send`, which lets go of the GIL): the woken event loop could take the GIL and
    serialize and send the chunk (~0.6 ms) while the engine thread waited to take it back,
    the pass not started (on a loaded machine, 5% of the engine thread's time, measured
    with py-spy: docs/performance.md). Now the emit calls only C code that keeps the GIL."""
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
    assert "put" in called
    assert set(called) <= HOLDS_THE_GIL, f"the emit called {sorted(set(called) - HOLDS_THE_GIL)}"


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
