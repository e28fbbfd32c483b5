"""engine/_llama_ffi.py's `decode`: the pass, its wait and a server's wake-up in one call of the
C kernel, which lets go of the GIL before it writes the descriptor a server lent
(engine/pass_hook.py, serve/handoff.py)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from loopchat.engine import _llama_ffi, pass_hook
from loopchat.engine._batch_ffi import LlamaBatch
from loopchat.engine.engine import Engine

pytestmark = pytest.mark.model

#: a pass long enough for a woken thread to run during it on a loaded machine (~0.3 s at 1 thread)
PREFILL = 400


class Lender:
    """A server's hand-off as pass_hook sees it, lending `fd`."""

    def __init__(self, fd: int) -> None:
        self.fd, self.lent, self.paid, self.settled = fd, 0, 0, 0

    def pay(self) -> None:
        self.paid += 1

    def lend(self) -> int:
        self.lent += 1
        return self.fd

    def settle(self) -> None:
        self.settled += 1


def test_the_kernel_makes_the_pass():
    """`make` builds the kernel: the passes go through its decode, not the ctypes calls."""
    assert _llama_ffi._decode_in_c is not None


def test_the_lent_descriptor_is_written_once_the_gil_is_let_go(model_path: Path):
    """A thread blocked reading the descriptor wakes on the decode's write and runs Python
    (it needs the GIL) while the pass still runs; the lender is settled once, after the
    decode returns, and pays nothing (the write was the decode's)."""
    engine = Engine(model_path, n_ctx=512, threads=1)
    batch = LlamaBatch(PREFILL)
    fd = os.eventfd(0)
    woke: list[int] = []

    def reader() -> None:
        os.read(fd, 8)  # (blocks without the GIL)
        woke.append(time.perf_counter_ns())  # (needs it)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    lender = Lender(fd)
    pass_hook.before_decode.append(lender)
    try:
        entries = [(0, 200 + i, i, i == PREFILL - 1) for i in range(PREFILL)]
        rc = batch.decode(engine.llm.ctx, entries)
        ended = time.perf_counter_ns()
        assert lender.settled == 1  # (settled before the decode returned)
    finally:
        pass_hook.before_decode.remove(lender)
        thread.join(30)
        os.close(fd)
        batch.free()
        engine.close()
    assert rc == 0
    assert (lender.lent, lender.paid, lender.settled) == (1, 0, 1)
    assert woke and woke[0] < ended


def test_a_second_server_pays_its_own_wake_up():
    """Two servers in one process (tests): the first that owes a wake-up lends its descriptor
    to the decode, any other pays (its own write, the GIL held); none owes: nothing lent."""
    first, second = Lender(-1), Lender(-1)  # (-1: nothing owed)
    pass_hook.before_decode.extend([first, second])
    try:
        assert pass_hook.lend() == (-1, None)
        assert (first.lent, second.lent, second.paid) == (1, 1, 0)
        first.fd = 7
        assert pass_hook.lend() == (7, first)
        assert (second.lent, second.paid) == (1, 1)
    finally:
        del pass_hook.before_decode[-2:]
