"""The engine thread's events to the event loop, without the engine thread waiting for it.

The engine thread appends each event to a deque (C code, the GIL kept) and, if the event
loop has not been woken since it last took the deque's events, wakes it: 8 bytes written
to an eventfd (a pipe where there is none) that the loop watches (`add_reader`). The
write is libc's `write` called through `ctypes.pythonapi` (a PyDLL: the GIL is kept
across the call), so the engine thread goes on, holding the GIL, into its forward pass;
the pass lets go of the GIL, and only then can the woken event loop take it and write
the token's chunk: the loop's work runs beside the pass, not before it. A shared batch's
tokens are put with the wake-up left to the pass (`put(soon=True)`): woken where they were
put, tens of microseconds of the engine thread's Python before the pass, the event loop's
thread woke into a wait for the GIL, one more sleep and wake-up a token. The pass's decode
makes it (engine/pass_hook.py): the C kernel's, which writes the descriptor `lend` gives it
once it has let go of the GIL (the woken loop then finds the GIL free; `settle` after the
pass), or, without the kernel, `pay` right before the ctypes call (which lets go of the GIL
a few microseconds after the write: the loop, woken meanwhile, often reached the GIL first
and slept on it again: docs/performance.md, "`loopchat serve`'s pass wakes the event loop
from C").

A wake-up that let go of the GIL (`loop.call_soon_threadsafe` on asyncio's loop writes
its self-pipe with a socket `send`, which does) would let the woken event loop take the
GIL while the engine thread waited to take it back, the pass not started. Until the
eleventh session a hand-off thread blocked on a queue made the wake-up instead: a third
thread woken each token (~60 us of CPU, and a wake-up that took a core from a llama
thread on a 2-core machine: docs/performance.md, "`loopchat serve` without the hand-off
thread").

Events keep their order (one deque, drained in order on the loop's thread); what has
queued up meanwhile goes in one wake-up.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any

#: libc's write(2), the GIL kept across the call (ctypes.pythonapi is a PyDLL of the process)
_write = ctypes.pythonapi.write
_write.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
_write.restype = ctypes.c_ssize_t
_ONE = (1).to_bytes(8, "little")  # an eventfd's write adds this 8-byte count


def _wake_fds() -> tuple[int, int]:
    """(read end, write end): one eventfd on Linux, else a pipe, both non-blocking."""
    if hasattr(os, "eventfd"):
        fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        return fd, fd
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


def _close_fds(read_fd: int, write_fd: int) -> None:
    os.close(read_fd)
    if write_fd != read_fd:
        os.close(write_fd)


class Handoff:
    """Calls `dispatch(event)` on `loop`'s thread for each event `put` from any thread, in order.
    Made on the loop's thread (it watches its wake-up descriptor there)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, dispatch: Callable[[Any], None]) -> None:
        self._loop = loop
        self._dispatch = dispatch
        self._events: collections.deque[Any] = collections.deque()
        self._woken = False  # the loop was woken and has not yet taken the events since
        self._owed = False  # events were put with the wake-up left to the pass (`pay`)
        self._lock = threading.Lock()  # a wake-up's write against close() (never waits otherwise)
        self._lent = 0  # descriptors lent to decodes not yet settled
        self._closed_fds: tuple[int, int] | None = None  # closed while lent: settle closes them
        self._read_fd, self._write_fd = _wake_fds()
        loop.add_reader(self._read_fd, self._drain)

    def put(self, event: Any, soon: bool = False) -> None:
        """Any thread; returns at once, the GIL kept throughout (never waits for the event loop).
        `soon`: the engine thread's pass follows at once, and the wake-up is left to it (`pay`,
        called right before llama_decode: engine/pass_hook.py) or to the next `put` (which
        makes it, `soon` or not: a wake-up is never left owed past one pass)."""
        self._events.append(event)
        if soon and not self._owed:
            self._owed = True
            return
        self._owed = False
        self._wake()

    def pay(self) -> None:
        """(The engine thread, right before a decode.) The wake-up a `put(soon=True)` left owed."""
        if self._owed:
            self._owed = False
            self._wake()

    def lend(self) -> int:
        """(The engine thread, right before a decode that can write it: the kernel's, which lets
        go of the GIL first: engine/_llama_ffi.py.) The descriptor to write for the wake-up a
        `put(soon=True)` left owed, counted as the loop's wake-up; -1: nothing to write. A
        descriptor lent stays open until `settle` (a close meanwhile waits for it)."""
        if not self._owed:
            return -1
        self._owed = False
        if self._woken:
            return -1
        with self._lock:
            if self._woken or self._write_fd < 0:
                return -1
            self._woken = True
            self._lent += 1
            return self._write_fd

    def settle(self) -> None:
        """(The engine thread, after the decode `lend` gave a descriptor to.) A close that came
        meanwhile closes the descriptors now."""
        fds = None
        with self._lock:
            self._lent -= 1
            if self._lent == 0:
                fds, self._closed_fds = self._closed_fds, None
        if fds is not None:
            _close_fds(*fds)

    def _wake(self) -> None:
        if not self._woken:
            with self._lock:
                if not self._woken and self._write_fd >= 0:
                    self._woken = True
                    _write(self._write_fd, _ONE, 8)  # (a full pipe: EAGAIN, the loop is woken anyway)

    def close(self) -> None:
        """Stop watching (the loop's thread, or once it has stopped); a later `put` is dropped.
        The descriptors close now, or once a decode that was lent one has written it (`settle`)."""
        with self._lock:
            read_fd, write_fd = self._read_fd, self._write_fd
            self._read_fd = self._write_fd = -1
            self._woken = True  # (no more writes, nor lends)
        if read_fd < 0:
            return
        try:
            self._loop.remove_reader(read_fd)
        except RuntimeError:  # the loop has closed: nothing watches it any more
            pass
        with self._lock:
            if self._lent:
                self._closed_fds = (read_fd, write_fd)  # (settle closes them)
                return
        _close_fds(read_fd, write_fd)

    def _drain(self) -> None:
        """(The event loop.) Every event queued so far, in order."""
        try:
            os.read(self._read_fd, 4096)  # (an eventfd's count, or a pipe's bytes: cleared)
        except BlockingIOError:  # pragma: no cover - woken with nothing written
            pass
        self._woken = self._owed = False  # (before taking the events: a put from now on wakes the loop again)
        events, dispatch = self._events, self._dispatch
        while events:
            dispatch(events.popleft())
