"""CPU-bound processes started beside the engine (the tests and benchmarks/busy_machine.py):
each ends by itself after a bounded time and is always killed when the block ends."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cpu_burners(n: int, seconds: float = 120.0) -> Iterator[None]:
    """`n` processes running `while True: pass` for at most `seconds`, killed on exit.

    Refused on a pytest-xdist worker that has company: the burners would slow the other
    worker's tests and that worker's load would skew this test's measure. A test that
    burns CPU carries the `alone` marker; `make test` runs those by themselves."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        raise RuntimeError("CPU burners beside another test worker: mark the test `alone` (pyproject.toml)")
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def quiet_machine(below: float = 0.25, within_s: float = 20.0) -> float:
    """Wait until the machine's other programs (and the hypervisor's steal) used less than
    `below` of a core over half a second, for at most `within_s` seconds; the last figure.

    A test that needs a quiet machine calls it first: after the parallel part of the suite,
    a test's server or browser may still be ending, and on a shared VM another guest may be
    busy for a while (steal): auto threads then rightly keeps fewer threads."""
    import time

    from loopchat.engine.thread_tuner import OtherCpuMeter

    meter = OtherCpuMeter()
    end = time.monotonic() + within_s
    seen = float("inf")
    while time.monotonic() < end:
        time.sleep(0.5)  # a sample spans half a second: the meter reads CPU time, not an event
        seen = meter.sample()
        if seen < below:
            break
    return seen
