"""How long llama.cpp's OpenMP threads spin at a barrier before they sleep: briefly.

llama.cpp's threads meet at a barrier at every node of the graph (~600 a pass of the
default model). libgomp spins there GOMP_SPINCOUNT rounds (300,000 by default) before it
sleeps on a futex. When the OS deschedules one thread (any other program running on a
2-core machine), the other spins through its time slice at every node: one pass at 2
threads took 1.9-8.6 s beside two CPU-bound programs, where 1 thread took 25 ms.
Spinning 1,000 rounds keeps almost all of the quiet machine's speed and none of the
stalls (`benchmarks/omp_wait.py`, docs/performance.md, "OpenMP's spin"):

    quiet, 2 threads: 88 tok/s spinning 300,000 rounds, 84 at 1,000, 72 passive
    beside 2 CPU-bound programs: 9 tok/s (worst pass 3.4 s), 34 (worst 82 ms), 50

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
