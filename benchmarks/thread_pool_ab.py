"""A/B of llama.cpp's thread back-ends for decode: OpenMP against ggml's own thread pool.

Issue 11, item 1: settle the llama.cpp build by measurement. This runs llama.cpp's own
llama-bench (token generation only: ``-p 0 -n N``) from two builds of the llama.cpp vendored
in the pinned llama-cpp-python sdist, built with the same CPU flags as the Makefile:

- the OpenMP build (what the project's wheel is today), at 1 and 2 threads;
- a build with ``-DGGML_OPENMP=OFF`` (ggml's own thread pool), at 2 threads with
  ``--poll`` 0, 50 (the default) and 100, and at 1 thread (poll 50 only: with one thread the
  pool has no worker threads, so the polling level cannot matter; ``--polls-1t`` to check).

Each configuration runs under 0, 1 and 2 competing CPU-bound processes
(``python3 -c "while True: pass"``-like loops that end by themselves after a bounded time,
and that this script always kills in a ``finally``). Configurations are alternated in rounds
(one llama-bench run of one repetition per configuration per round, in a rotated order), so
that noise from the rest of the machine falls on all of them alike. It prints, per condition,
the median tok/s over the rounds, the ratio to the OpenMP 2-thread figure with no competitor,
and the ratio to the best configuration in the same condition.

Build the two binaries first (each ~5 min on 2 cores, outside the repo):

    benchmarks/build_llama_bench.sh
    LLAMA_BENCH_CMAKE_ARGS=-DGGML_OPENMP=OFF \\
      LLAMA_BENCH_DIR=~/.cache/loopchat/llama-bench-0.3.36-noomp-f16vecdot benchmarks/build_llama_bench.sh

then (about 5-6 minutes with the defaults on an otherwise idle 2-core machine; every llama-bench
run is capped at --timeout seconds and a run that hits the cap is left out of the medians):

    .venv/bin/python benchmarks/thread_pool_ab.py [--rounds 3] [--competitors 0,1,2] \\
        [--omp PATH] [--noomp PATH] [--model GGUF] [--n-gen 128] [--json-out FILE]

"Quiet" means no competitor started by this script; the 1-minute load average before each
condition is printed so that a machine busy with other work shows in the output.

Measured 2026-12-03 (2-core shared machine, SmolLM2-135M Q4_1, tg128, medians of 5 rounds; other
sessions' benchmarks ran at times, load average 2.5-6): with no competitor every 2-thread
configuration gave 99-104 tok/s (OpenMP 99.1, pool poll 0/50/100: 102.2/99.3/103.5) and 1 thread
60; with 1 competitor OpenMP t2 5.7, pool t2 32-34, t1 59-60 in both builds; with 2
competitors OpenMP t2 33.5, pool t2 6-17, t1 41-43. No build is ahead by more than 5% at its best
thread count in any condition; the thread count decides, not the build.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CACHE = Path.home() / ".cache" / "loopchat"
DEFAULT_OMP = CACHE / "llama-bench-0.3.36-f16vecdot" / "build" / "bin" / "llama-bench"
DEFAULT_NOOMP = CACHE / "llama-bench-0.3.36-noomp-f16vecdot" / "build" / "bin" / "llama-bench"

# A CPU-bound loop that ends by itself: even if this script is killed hard, no competitor
# outlives it by more than its time bound.
_COMPETITOR = "import time\nend = time.monotonic() + {secs}\nwhile time.monotonic() < end: pass\n"


@dataclass(frozen=True)
class Config:
    build: str  # "omp" or "noomp"
    threads: int
    poll: int  # ignored by the OpenMP build

    @property
    def label(self) -> str:
        if self.build == "omp":
            return f"OpenMP t{self.threads}"
        return f"pool   t{self.threads} poll {self.poll}"


def default_model() -> str:
    from loopchat.model_files import builtin_model_path

    return str(builtin_model_path())


def start_competitors(n: int, secs: float) -> list[subprocess.Popen]:
    procs = []
    for _ in range(n):
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _COMPETITOR.format(secs=secs)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    time.sleep(0.3)  # let them get going
    return procs


def stop_competitors(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def run_bench(binary: Path, model: str, cfg: Config, n_gen: int, timeout: float) -> float | None:
    """One llama-bench run, one repetition (after llama-bench's warm-up); tok/s or None."""
    cmd = [
        str(binary),
        "-m",
        model,
        "-p",
        "0",
        "-n",
        str(n_gen),
        "-t",
        str(cfg.threads),
        "--poll",
        str(cfg.poll),
        "-r",
        "1",
        "-o",
        "json",
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        print(f"  timeout: {cfg.label}", file=sys.stderr)
        return None
    except subprocess.CalledProcessError as e:
        print(f"  failed: {cfg.label}: {e.stderr[-500:]}", file=sys.stderr)
        return None
    rows = json.loads(out.stdout)
    return float(rows[0]["avg_ts"])


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--omp", type=Path, default=DEFAULT_OMP, help="llama-bench built with OpenMP")
    ap.add_argument("--noomp", type=Path, default=DEFAULT_NOOMP, help="llama-bench built with GGML_OPENMP=OFF")
    ap.add_argument("--model", default=None, help="GGUF model (default: loopchat's built-in model)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--competitors", default="0,1,2", help="comma list of competitor counts")
    ap.add_argument("--polls", default="0,50,100", help="poll levels for the no-OpenMP build at 2 threads")
    ap.add_argument("--polls-1t", default="50", help="poll levels for the no-OpenMP build at 1 thread")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per llama-bench run")
    ap.add_argument("--json-out", type=Path, default=None, help="write every sample here")
    args = ap.parse_args()

    for b in (args.omp, args.noomp):
        if not os.access(b, os.X_OK):
            print(f"no llama-bench at {b}: see the module docstring to build it", file=sys.stderr)
            return 2
    model = args.model or default_model()
    conditions = [int(c) for c in args.competitors.split(",")]
    configs = [Config("omp", 1, 50), Config("omp", 2, 50)]
    configs += [Config("noomp", 1, int(p)) for p in args.polls_1t.split(",")]
    configs += [Config("noomp", 2, int(p)) for p in args.polls.split(",")]
    binaries = {"omp": args.omp, "noomp": args.noomp}

    samples: dict[tuple[int, Config], list[float]] = {(c, k): [] for c in conditions for k in configs}
    loads: dict[int, list[str]] = {c: [] for c in conditions}
    # Competitors live for one condition of one round at most: bound their life accordingly.
    competitor_secs = args.timeout * len(configs) + 30
    t0 = time.monotonic()
    for r in range(args.rounds):
        for ci, cond in enumerate(conditions):
            # rotate the order each round and condition so no configuration always goes first
            shift = (r * len(conditions) + ci) % len(configs)
            order = configs[shift:] + configs[:shift]
            loads[cond].append(loadavg())
            procs: list[subprocess.Popen] = []
            try:
                procs = start_competitors(cond, competitor_secs)
                for cfg in order:
                    ts = run_bench(binaries[cfg.build], model, cfg, args.n_gen, args.timeout)
                    if ts is not None:
                        samples[(cond, cfg)].append(ts)
            finally:
                stop_competitors(procs)
            print(
                f"round {r + 1}/{args.rounds}, {cond} competitor(s) done "
                f"({time.monotonic() - t0:.0f} s, load before {loads[cond][-1]})",
                file=sys.stderr,
                flush=True,
            )

    med = {key: (statistics.median(v) if v else float("nan")) for key, v in samples.items()}
    base_key = (0, Config("omp", 2, 50))
    base = med.get(base_key, float("nan"))
    print(f"\nllama-bench tg{args.n_gen}, {args.rounds} rounds, median tok/s; model {Path(model).name}")
    print(f"reference: OpenMP t2 with no competitor = {base:.1f} tok/s\n")
    print(
        f"{'competitors':>11}  {'configuration':<20} {'median':>7} {'min':>6} {'max':>6} {'vs ref':>7} {'vs best':>8}"
    )
    for cond in conditions:
        best = max(med[(cond, k)] for k in configs)
        for k in configs:
            v = samples[(cond, k)]
            m = med[(cond, k)]
            lo = min(v) if v else float("nan")
            hi = max(v) if v else float("nan")
            mark = "  <- best" if m == best else ""
            print(f"{cond:>11}  {k.label:<20} {m:7.1f} {lo:6.1f} {hi:6.1f} {m / base:7.2f} {m / best:8.2f}{mark}")
        print(f"{'':>11}  (1-min load average before each round: {', '.join(loads[cond])})\n")
    if args.json_out:
        args.json_out.write_text(
            json.dumps(
                {
                    "model": model,
                    "n_gen": args.n_gen,
                    "rounds": args.rounds,
                    "loadavg": {str(c): loads[c] for c in conditions},
                    "samples": [
                        {"competitors": c, "build": k.build, "threads": k.threads, "poll": k.poll, "tok_s": v}
                        for (c, k), v in samples.items()
                    ],
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
