"""CPU-bound processes started beside the engine (the tests and benchmarks/busy_machine.py):
each ends by itself after a bounded time and is always killed when the block ends."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cpu_burners(n: int, seconds: float = 120.0) -> Iterator[None]:
    """`n` processes running `while True: pass` for at most `seconds`, killed on exit."""
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
