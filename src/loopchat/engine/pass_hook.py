"""A call the engine thread makes right before each step's llama_decode: `before_decode`.

`loopchat serve` sets it (serve/handoff.py) to wake its event loop there: the engine thread
hands a pass's tokens over holding the GIL, and the event loop, woken a microsecond before
the pass lets go of the GIL, finds it free instead of waiting for it (a wake-up made sooner,
where the events were handed over, woke the event loop into a wait for the GIL: one more
sleep and wake-up of its thread a token; docs/performance.md, "`loopchat serve` without the
hand-off thread"). Called by `_llama_ffi.LlamaCalls.decode_one` / `decode_all` (a reply's
own pass, a verifying pass) and `_batch_ffi.decode_entries` (a shared batch's pass, a joint
prefill, a probe); empty (the chat, `run`): nothing is called.
"""

from __future__ import annotations

from collections.abc import Callable

#: what is called, in order (a server in a thread of a test's process beside another: each
#: one's; a call with nothing owed costs an attribute read)
before_decode: list[Callable[[], None]] = []


def call() -> None:
    """(The engine thread, the GIL held, right before llama_decode.)"""
    for hook in before_decode:
        hook()
