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
