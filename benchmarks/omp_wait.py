"""Does OpenMP's wait policy cause the multi-second passes of 2 threads on a busy 2-core
machine? (issue 22, section 2.)

This build of llama.cpp uses OpenMP: ggml's barrier between two graph nodes is
`#pragma omp barrier`, where libgomp spins (GOMP_SPINCOUNT rounds, 300,000 by default
when OMP_WAIT_POLICY is unset) before it sleeps on a futex. When the OS deschedules one
of the threads, the other spins through its time slice at every node. This script runs
single-token forward passes of the default model with a fixed thread count, in a fresh
process per configuration (libgomp reads its environment once, at start), beside each
load of busy_load.py, and prints each configuration's pass times: mean, p50, p99, worst,
passes over 250 ms, and tok/s (passes per second of forward time).

    .venv/bin/python benchmarks/omp_wait.py [--loads quiet,burners2,compile] [--passes 300] [--max-s 25]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

CONFIGS = {
    "1": (1, {}),
    "2": (2, {}),
    "2 OMP_WAIT_POLICY=passive": (2, {"OMP_WAIT_POLICY": "passive"}),
    "2 GOMP_SPINCOUNT=0": (2, {"GOMP_SPINCOUNT": "0"}),
    "2 GOMP_SPINCOUNT=1000": (2, {"GOMP_SPINCOUNT": "1000"}),
    "2 GOMP_SPINCOUNT=10000": (2, {"GOMP_SPINCOUNT": "10000"}),
}


def child(threads: int, passes: int, max_s: float) -> dict:
    from loopchat.config import load_config
    from loopchat.engine.engine import Engine

    spec = load_config(None).get(None)
    eng = Engine(spec.resolve_file(), n_ctx=2048, threads=threads, log_path=Path(os.devnull))
    token = max(eng.llm.token_bos(), 0)
    times = []
    end = time.monotonic() + max_s
    for pos in range(1, min(passes, eng.n_ctx - 1) + 1):
        t0 = time.perf_counter()
        eng._c.decode_one(token, pos)
        eng._c.synchronize()
        times.append((time.perf_counter() - t0) * 1000.0)
        if time.monotonic() > end:
            break
    eng.close()
    return {"ms": times}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loads", default="quiet,burners2,compile")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="names from CONFIGS, comma-separated")
    ap.add_argument("--passes", type=int, default=300)
    ap.add_argument("--max-s", type=float, default=25.0, help="a configuration's time limit")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(int(args.child[0]), int(args.child[1]), float(args.child[2]))))
        return
    from busy_load import load

    print(f"{'load':<10}{'configuration':<30}{'mean':>8}{'p50':>8}{'p99':>8}{'worst':>9}{'>250ms':>8}{'tok/s':>8}")
    for name in args.loads.split(","):
        with load(name, seconds=60 + len(CONFIGS) * (args.max_s + 10)):
            time.sleep(1.0)
            for label in args.configs.split(","):
                threads, env = CONFIGS[label]
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", str(threads), str(args.passes), str(args.max_s)],
                    capture_output=True,
                    text=True,
                    timeout=args.max_s + 120,
                    env={**os.environ, **env},
                )
                if proc.returncode:
                    raise SystemExit(proc.stderr[-2000:])
                ms = json.loads(proc.stdout.strip().splitlines()[-1])["ms"][5:]  # the first passes warm up
                mean = statistics.fmean(ms)
                print(
                    f"{name:<10}{label:<30}{mean:8.1f}{pct(ms, 0.5):8.1f}{pct(ms, 0.99):8.1f}{max(ms):9.1f}"
                    f"{sum(1 for m in ms if m > 250):8d}{1000 / mean:8.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
