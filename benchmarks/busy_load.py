"""Loads for benchmarks/busy_machine.py and benchmarks/omp_wait.py, each bounded in time
and always killed when its block ends:

- `burners(n)`: n pure CPU burners (tests/cpu_burners.py: `while True: pass`);
- `compile_mix(n)`: n processes that work like a build's compilers: busy for 5-120 ms,
  then asleep for 1-40 ms (reading files, waiting for the next job), and every ~0.5 s a
  short-lived child process (a new compiler run) busy for 20-200 ms; on average each
  keeps ~0.7 of a core busy, in bursts the scheduler cannot predict;
- `second_loopchat()`: another `loopchat run` generating long replies one after another
  (threads auto), the "another model" of issue 22.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from cpu_burners import cpu_burners as burners  # noqa: E402,F401

_MIX = """
import os, random, subprocess, sys, time
end = time.monotonic() + {seconds}
rng = random.Random(os.getpid())
next_child = time.monotonic()
def spin(ms):
    stop = time.perf_counter() + ms / 1000
    while time.perf_counter() < stop: pass
while time.monotonic() < end:
    spin(rng.uniform(5, 120))
    time.sleep(rng.uniform(0.001, 0.040))
    if time.monotonic() >= next_child:
        next_child = time.monotonic() + rng.uniform(0.2, 0.8)
        ms = rng.uniform(20, 200)
        subprocess.Popen([sys.executable, "-S", "-c",
            "import time\\ns=time.perf_counter()+%f\\nwhile time.perf_counter()<s: pass" % (ms / 1000)])
"""


@contextmanager
def _procs(cmds: list[list[str]]) -> Iterator[None]:
    procs = [
        subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True) for c in cmds
    ]
    try:
        yield
    finally:
        import os
        import signal

        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the process and the children it started
            except ProcessLookupError:
                pass
        for p in procs:
            p.wait()


def compile_mix(n: int, seconds: float = 600.0) -> contextmanager[None]:
    return _procs([[sys.executable, "-c", _MIX.format(seconds=seconds)] for _ in range(n)])


def second_loopchat(seconds: float = 600.0) -> contextmanager[None]:
    loop = (
        "import subprocess, sys, time\n"
        f"end = time.monotonic() + {seconds}\n"
        "while time.monotonic() < end:\n"
        "    subprocess.run([sys.executable, '-m', 'loopchat', 'run', '--max-tokens', '400', '--raw',\n"
        "                    'Once upon a time, in a long story,'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,\n"
        "                   timeout=max(1.0, end - time.monotonic()))\n"
    )
    return _procs([[sys.executable, "-c", loop]])


@contextmanager
def load(name: str, seconds: float = 600.0) -> Iterator[None]:
    """A named condition: quiet, burners1, burners2, mix (compile mix of 2 + one burner-free
    second loopchat), compile (compile mix of 2), loopchat (a second loopchat)."""
    with ExitStack() as stack:
        if name.startswith("burners"):
            stack.enter_context(burners(int(name[len("burners") :]), seconds))
        elif name == "compile":
            stack.enter_context(compile_mix(2, seconds))
        elif name == "loopchat":
            stack.enter_context(second_loopchat(seconds))
        elif name == "mix":
            stack.enter_context(compile_mix(2, seconds))
            stack.enter_context(second_loopchat(seconds))
        elif name != "quiet":
            raise SystemExit(f"unknown load {name!r}: quiet, burners1, burners2, compile, loopchat, mix")
        yield
