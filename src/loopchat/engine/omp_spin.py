"""How long llama.cpp's OpenMP threads spin at a barrier before they sleep: briefly.

llama.cpp's threads meet at a barrier at every node of the graph (~600 a pass of the
default model). libgomp spins there GOMP_SPINCOUNT rounds (300,000 by default) before it
sleeps on a futex. When the OS deschedules one thread (any other program running on a
2-core machine), the other spins through its time slice at every node: one pass at 2
threads beside two CPU-bound programs took seconds where 1 thread took milliseconds.
Spinning 1,000 rounds keeps almost all of the quiet machine's speed and none of the
stalls (`benchmarks/omp_wait.py`; the figures: docs/performance.md, "OpenMP's spin",
and "Auto threads never stall a reply").

libgomp reads its environment once, when llama.cpp's library loads it: `apply()` must
run before `import llama_cpp`, so the package's __init__ calls it (any loopchat module
runs it first). A wait policy or spin count the user set is left alone.
"""

from __future__ import annotations

import os

SPIN_COUNT = "1000"


def apply() -> None:
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
