"""A call the engine thread makes right before each step's llama_decode: `before_decode`.

`loopchat serve` sets it (serve/handoff.py) to wake its event loop there: the engine thread
hands a pass's tokens over holding the GIL, and the event loop, woken a microsecond before
the pass lets go of the GIL, finds it free instead of waiting for it (a wake-up made sooner,
where the events were handed over, woke the event loop into a wait for the GIL: one more
sleep and wake-up of its thread a token; docs/performance.md, "`loopchat serve` without the
hand-off thread"). Where the C kernel is built, the wake-up is the kernel's decode's own, made
once it has let go of the GIL (`lend`: the woken loop then finds the GIL free, instead of
reaching it before the ctypes call let go of it: docs/performance.md, "`loopchat serve`'s
pass wakes the event loop from C"). Called by `_llama_ffi.decode` (`LlamaCalls.decode_one` /
`decode_all`: a reply's own pass, a verifying pass; `_batch_ffi.BatchCalls.decode`: a shared
batch's pass, a probe; `_slot_ffi.PrefillBatch.decode_entries`: a joint prefill; these two through
`_batch_ffi.LlamaBatch.decode`); empty (the chat, `run`): nothing is called.
"""

from __future__ import annotations

from typing import Protocol


class Waker(Protocol):
    """What a server attaches (serve/handoff.py's Handoff)."""

    def pay(self) -> None:
        """The wake-up owed, made now (the GIL held)."""

    def lend(self) -> int:
        """The descriptor the decode writes for the wake-up owed, once it has let go of the GIL
        (-1: nothing owed); `settle` follows the decode."""

    def settle(self) -> None:
        """The decode that was lent a descriptor has returned."""


#: what is called, in order (a server in a thread of a test's process beside another: each
#: one's; a call with nothing owed costs an attribute read)
before_decode: list[Waker] = []


def call() -> None:
    """(The engine thread, the GIL held, right before a llama_decode made through ctypes.)"""
    for waker in before_decode:
        waker.pay()


def lend() -> tuple[int, Waker | None]:
    """(The engine thread, right before the kernel's decode, which lets go of the GIL, then
    writes the descriptor, then runs the pass.) The first attached waker that owes a wake-up
    lends its descriptor (-1: none owes one); any other pays now. The lender is settled once
    the decode returns (`_llama_ffi.decode`)."""
    fd, lender = -1, None
    for waker in before_decode:
        if lender is None:
            fd = waker.lend()
            if fd >= 0:
                lender = waker
        else:
            waker.pay()
    return fd, lender
