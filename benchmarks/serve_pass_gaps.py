"""Where a streamed token's wall time goes in `loopchat serve`, around the forward pass.

Starts `loopchat serve` (a source tree's, --tree) with three probes put in before it runs,
sends --requests streamed requests (benchmarks/serve_vs_llama_server.py's: 128 tokens,
top_logprobs 5, llama-server's default sampling), and prints, over every single-token pass:

- the pass in C: from llama_decode's call to its return, read with CLOCK_MONOTONIC by a
  three-line C shim around it (compiled here against the pinned llama.cpp's headers);
- the GIL's hand-back: from llama_decode's return in C to the next Python line of the
  engine thread (ctypes re-takes the GIL there: when another thread runs Python, the
  engine waits for it to block or for the switch interval, `sys.getswitchinterval()`),
  and the call's way in (Python to C);
- the engine thread's Python between two passes (the draw, the Step, the hand-off);
- what the event loop ran (every asyncio callback, timed) during each pass and during the
  engine's Python between passes (there it holds the GIL the engine thread wants).

perf_counter_ns is CLOCK_MONOTONIC on Linux: the C and Python stamps share one clock.
--policies normal,batch: two servers up at once, requests alternating, the second with the
hand-off's and the event loop's threads SCHED_BATCH (an experiment: docs/performance.md, "What
runs beside the pass"). SERVE_GAPS_PROFILE=PATH writes a cProfile of the event loop's thread.

    .venv/bin/python benchmarks/serve_pass_gaps.py [--tree .] [--threads 2] [--requests 4] [--tokens 128]
        [--parallel 4] [--flash-attn off] [--policies normal,batch]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

SHIM = r"""
#include <stdint.h>
#include <time.h>
#include "llama.h"
typedef int32_t (*decode_fn)(struct llama_context *, struct llama_batch);
static decode_fn real;
void shim_set(void *fn) { real = (decode_fn)fn; }
static int64_t now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1000000000LL + ts.tv_nsec; }
int32_t shim_decode(struct llama_context *ctx, struct llama_batch batch, int64_t *t) {
    t[0] = now(); int32_t rc = real(ctx, batch); t[1] = now(); return rc;
}
"""


def build_shim(out: Path) -> Path:
    src = sorted(Path.home().glob(".cache/loopchat/llama-bench-*/llama_cpp_python-*/vendor/llama.cpp"))
    if not src:
        raise SystemExit("no llama.cpp source: run benchmarks/build_llama_bench.sh first")
    root = src[0]
    c = out / "shim.c"
    c.write_text(SHIM)
    so = out / "shim.so"
    inc = ["-I", str(root / "include"), "-I", str(root / "ggml" / "include")]
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", *inc, str(c), "-o", str(so)], check=True)
    return so


# ---------------------------------------------------------------- the server's side ----
def child(shim_path: str, dump: str, argv: list[str]) -> None:
    import atexit

    passes: list[tuple[int, int, int, int]] = []
    loop_runs: list[tuple[int, int]] = []
    by_name: dict[str, list[float]] = {}
    _probe_decode(shim_path, passes)
    probe_loop(loop_runs, by_name)

    def write() -> None:
        Path(dump).write_text(json.dumps({"passes": passes, "loop": loop_runs, "by_name": by_name}))

    atexit.register(write)
    if os.environ.get("SERVE_GAPS_POLICY") == "batch":
        _batch_policy()
    if os.environ.get("SERVE_GAPS_PROFILE"):
        _profile_loop(os.environ["SERVE_GAPS_PROFILE"])
    from loopchat.cli.main import entry

    sys.argv = ["loopchat", *argv]
    entry()


def _batch_policy() -> None:
    """The experiment: the event loop's thread SCHED_BATCH (no wake-up preemption: woken as
    the engine thread lets go of the GIL, it no longer takes its core). (Until the eleventh
    session the hand-off thread's too: there is none now, serve/handoff.py.)"""
    import threading

    from loopchat.serve import loop as serve_loop

    def batch() -> None:
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_BATCH, os.sched_param(0))

    attach = serve_loop.OneLoop.attach

    def loop_attach(self: serve_loop.OneLoop) -> None:  # (the event loop's thread, the engine's already started)
        batch()
        attach(self)

    serve_loop.OneLoop.attach = loop_attach  # type: ignore[method-assign]


def _probe_decode(shim_path: str, passes: list[tuple[int, int, int, int]]) -> None:
    """LlamaCalls.decode_one through the shim: (Python before, C in, C out, Python after) a pass."""
    import ctypes
    import time

    import llama_cpp

    from loopchat.engine import _llama_ffi

    shim = ctypes.CDLL(shim_path)
    shim.shim_set.argtypes = [ctypes.c_void_p]
    shim.shim_set(ctypes.cast(llama_cpp.llama_cpp._lib.llama_decode, ctypes.c_void_p).value)
    shim.shim_decode.argtypes = [ctypes.c_void_p, llama_cpp.llama_batch, ctypes.POINTER(ctypes.c_int64)]
    shim.shim_decode.restype = ctypes.c_int32
    stamps = (ctypes.c_int64 * 2)()
    clock = time.perf_counter_ns

    def decode_one(self: _llama_ffi.LlamaCalls, token: int, pos: int) -> int:
        self._token[0] = token
        self._batch.pos[0] = pos
        a = clock()
        rc = shim.shim_decode(self._ctx, self._batch, stamps)
        b = clock()
        passes.append((a, stamps[0], stamps[1], b))
        return int(rc)

    _llama_ffi.LlamaCalls.decode_one = decode_one  # type: ignore[method-assign]


def probe_loop(loop_runs: list[tuple[int, int]], by_name: dict[str, list[float]] | None = None) -> None:
    """Every callback the event loop (the main thread) runs, timed, and summed by name where
    `by_name` is given (on asyncio's own loop: uvloop's callbacks run in C, out of this probe's
    reach; serve_batch_parts.py uses it too)."""
    import asyncio.events

    from loopchat.serve import http_stack

    http_stack.event_loop = lambda: "asyncio"  # type: ignore[assignment]
    import threading
    import time

    clock = time.perf_counter_ns
    main = threading.main_thread()
    run = asyncio.events.Handle._run

    def timed_run(self: asyncio.events.Handle) -> None:
        if threading.current_thread() is not main:
            return run(self)
        a = clock()
        try:
            return run(self)
        finally:
            b = clock()
            loop_runs.append((a, b))
            if by_name is not None:
                _count(by_name, self._callback, (b - a) / 1e6)

    asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]


def _count(by_name: dict[str, list[float]], cb: Any, ms: float) -> None:
    """One callback's run added to its name's count and ms (a task: with its coroutine's name)."""
    name = getattr(cb, "__qualname__", None) or type(cb).__name__
    if "Task" in name:  # (which coroutine the task runs)
        coro = getattr(getattr(cb, "__self__", None), "get_coro", lambda: None)()
        name += ":" + getattr(coro, "__qualname__", "?")
    slot = by_name.setdefault(name, [0, 0.0])
    slot[0] += 1
    slot[1] += ms


def _profile_loop(path: str) -> None:
    """cProfile of the main thread (the event loop), its top 45 by own time written to `path` at exit."""
    import atexit
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()

    def write_profile() -> None:
        prof.disable()
        with open(path, "w") as out:
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(45)

    atexit.register(write_profile)


# ---------------------------------------------------------------- the analysis ----
def overlap(intervals: list[tuple[int, int]], a: int, b: int, start: int) -> tuple[float, int]:
    """ns of `intervals` (sorted) inside [a, b], from index `start` on; and the next start."""
    total, i = 0, start
    while i < len(intervals) and intervals[i][1] < a:
        i += 1
    j = i
    while j < len(intervals) and intervals[j][0] < b:
        lo, hi = max(a, intervals[j][0]), min(b, intervals[j][1])
        total += max(0, hi - lo)
        j += 1
    return total, i


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def report(data: dict) -> None:
    passes = [tuple(p) for p in data["passes"]]
    loop = sorted(tuple(x) for x in data["loop"])
    c_ms = [(p[2] - p[1]) / 1e6 for p in passes]
    back = [(p[3] - p[2]) / 1e6 for p in passes]
    way_in = [(p[1] - p[0]) / 1e6 for p in passes]
    between, loop_in_pass, loop_in_py, busy_at_return = [], [], [], 0
    k = 0
    for i, p in enumerate(passes):
        ov, k = overlap(loop, p[1], p[2], k)
        loop_in_pass.append(ov / 1e6)
        if any(lo <= p[2] <= hi for lo, hi in loop[max(0, k - 2) : k + 40]):
            busy_at_return += 1
        if i + 1 < len(passes) and passes[i + 1][0] - p[3] < 50e6:  # the same reply
            between.append((passes[i + 1][0] - p[3]) / 1e6)
            ov2, _ = overlap(loop, p[3], passes[i + 1][0], k)
            loop_in_py.append(ov2 / 1e6)

    def line(name: str, xs: list[float]) -> None:
        print(
            f"  {name:44} median {statistics.median(xs):7.3f}  mean {statistics.fmean(xs):7.3f}  "
            f"p90 {pct(xs, 0.9):7.3f}  p99 {pct(xs, 0.99):7.3f}  max {max(xs):7.3f} ms"
        )

    print(f"{len(passes)} single-token passes, {len(loop)} event-loop callbacks, load {os.getloadavg()[0]:.1f}")
    line("the pass in C (llama_decode)", c_ms)
    line("the GIL's hand-back (C return -> Python)", back)
    line("the call's way in (Python -> C)", way_in)
    line("the engine's Python between passes", between)
    line("event loop's work during the pass", loop_in_pass)
    line("event loop's work during the engine's Python", loop_in_py)
    for lim in (0.05, 0.2, 1.0):
        print(
            f"  hand-backs over {lim} ms: {sum(b > lim for b in back)} ({100 * sum(b > lim for b in back) / len(back):.1f}%)"
        )
    print(f"  passes that returned while an event-loop callback ran: {busy_at_return}")
    print("  event-loop callbacks per pass, by callback (count, ms):")
    for name, (n, ms) in sorted(data.get("by_name", {}).items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"    {n / len(passes):6.2f}  {ms / len(passes):7.3f}  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", default=str(HERE.parent))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--flash-attn", default="off")
    ap.add_argument(
        "--policies", default="normal", help="normal, batch or both (normal,batch: up at once, alternating)"
    )
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        shim, dump, *rest = args.child
        child(shim, dump, rest)
        return
    sys.path.insert(0, str(HERE))
    from serve_overhead import PY, Child, stream_request
    from serve_vs_llama_server import body

    policies = args.policies.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        shim = build_shim(Path(tmp))
        os.environ["PYTHONPATH"] = str(Path(args.tree).resolve() / "src")
        serve = ["serve", "--port", "0", "--threads", str(args.threads), "--parallel", str(args.parallel)]
        serve += ["--flash-attn", args.flash_attn]
        servers: dict[str, Any] = {}
        rates: dict[str, list[float]] = {p: [] for p in policies}
        try:
            for policy in policies:
                os.environ["SERVE_GAPS_POLICY"] = policy
                dump = str(Path(tmp) / f"{policy}.json")
                servers[policy] = Child(
                    [PY, __file__, "--child", str(shim), dump, *serve], r"listening on (http://\S+)"
                )
                stream_request(servers[policy].url, body(16))
            for i in range(args.requests):
                for policy in policies[i % len(policies) :] + policies[: i % len(policies)]:
                    rates[policy].append(stream_request(servers[policy].url, body(args.tokens))["tok_s"])
        finally:
            for server in servers.values():
                server.stop()
        for policy in policies:
            print(f"== {policy}: client decode tok/s {', '.join(f'{r:.1f}' for r in rates[policy])}")
            if policy != policies[0]:
                ratio = statistics.median(a / b for a, b in zip(rates[policy], rates[policies[0]]))
                print(f"  against {policies[0]}: {ratio:.3f} (median of the pairs)")
            report(json.loads((Path(tmp) / f"{policy}.json").read_text()))


if __name__ == "__main__":
    main()
