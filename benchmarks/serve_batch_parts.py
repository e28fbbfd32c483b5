"""Where a served pass of N goes in `loopchat serve --parallel 8`, beside the bare pass of N.

serve_batch.py gives the rates; this gives their parts, measured side by side in one run, so
that a loaded machine's noise can be read through CPU times. One server (a child process of
this script, the default model, --threads) with two probes put in before it runs:

- every `BatchCalls.decode` (a shared batch's pass, a probe, a bare batch's) stamped with
  perf_counter_ns before and after, with the number of its sequences and the engine thread's
  CPU across it (`time.thread_time_ns`: the decode's share on the thread that calls it);
- every callback the event loop (the main thread) runs, timed (asyncio's own loop).

Per round, alternating: the bare batch of N (batch.py's `bare`, in this process, the server
idle), then N streaming clients together (serve_batch.py's `together`, the extension on or
off). Printed, medians over the rounds:

  bare pass         one bare pass of N (wall; the calling thread's CPU)
  served pass       one served pass of N, llama_decode alone (wall; the engine thread's CPU)
  gap               from one served pass's return to the next pass's call: the engine
                    thread's Python (each sequence's draw and Step, the flush, the pass's own
                    Python); a probe (a single-sequence pass at passes 1, 2, 3 and every 64th,
                    docs/trace-format.md "Parallel sequences") falls in its gap and is counted
                    apart
  loop in pass      the event loop's callbacks during a served pass (the chunks' serializing,
                    uvicorn's send): work that takes a core from llama.cpp's threads
  by thread         the server's CPU a token per thread (/proc's schedstat): the two llama
                    threads (the engine thread, which runs its share of each pass and the
                    Python, and OpenMP's worker), the event loop, the rest (the sampler's
                    helper); and this process's CPU a token (the clients, their threads)

    .venv/bin/python benchmarks/serve_batch_parts.py [--sizes 4] [--tokens 48] [--rounds 3]
        [--threads 2] [--extension on]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


# ---------------------------------------------------------------- the server's side ----
def child(dump: str, argv: list[str]) -> None:
    """`loopchat serve` with the two probes; what they saw written to `dump` at exit."""
    import atexit

    from serve_pass_gaps import probe_loop

    from loopchat.engine import _batch_ffi

    passes: list[tuple[int, int, int, int, int]] = []  # (call, return, sequences, thread CPU, thread)
    loop_runs: list[tuple[int, int]] = []
    clock, cpu = time.perf_counter_ns, time.thread_time_ns
    decode = _batch_ffi.BatchCalls.decode

    def timed_decode(self: Any, tokens: list[tuple[int, int, int]]) -> int:
        a, ca = clock(), cpu()
        rc = decode(self, tokens)
        passes.append((a, clock(), len(tokens), cpu() - ca, threading.get_native_id()))
        return rc

    _batch_ffi.BatchCalls.decode = timed_decode  # type: ignore[method-assign]
    import llama_cpp
    import llama_cpp.llama_cpp as llama_module

    prefills: list[tuple[int, int, int]] = []  # (call, return, tokens): every llama_decode of 2 tokens or more
    llama_decode = llama_module.llama_decode

    def timed_llama_decode(ctx: Any, batch: Any) -> int:
        a = clock()
        rc = llama_decode(ctx, batch)
        if batch.n_tokens > 1:
            prefills.append((a, clock(), batch.n_tokens))
        return rc

    llama_module.llama_decode = llama_cpp.llama_decode = timed_llama_decode
    probe_loop(loop_runs)  # (asyncio's loop: uvloop's callbacks are out of reach)
    atexit.register(
        lambda: Path(dump).write_text(json.dumps({"passes": passes, "loop": loop_runs, "prefills": prefills}))
    )
    from loopchat.cli.main import entry

    sys.argv = ["loopchat", *argv]
    entry()


# ---------------------------------------------------------------- this side ----
def thread_cpu(pid: int) -> dict[int, int]:
    """Each thread's CPU so far, ns (/proc's schedstat)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError):  # (a thread that ended meanwhile)
            pass
    return out


def bare_passes(engine: Any, prompt: list[int], n: int, tokens: int) -> tuple[float, float]:
    """A bare batch of N (batch.py's), its passes timed by the same decode probe: (wall, CPU) medians, ms."""
    from loopchat.engine import _batch_ffi

    got: list[tuple[float, float]] = []
    decode = _batch_ffi.BatchCalls.decode

    def timed(self: Any, triples: list[tuple[int, int, int]]) -> int:
        a, ca = time.perf_counter_ns(), time.thread_time_ns()
        rc = decode(self, triples)
        got.append(((time.perf_counter_ns() - a) / 1e6, (time.thread_time_ns() - ca) / 1e6))
        return rc

    _batch_ffi.BatchCalls.decode = timed  # type: ignore[method-assign]
    try:
        from batch import bare

        bare(engine, prompt, n, tokens)
    finally:
        _batch_ffi.BatchCalls.decode = decode  # type: ignore[method-assign]
    return statistics.median(w for w, _ in got), statistics.median(c for _, c in got)


def served_parts(data: dict[str, Any], n: int, since: int, until: int) -> dict[str, float]:
    """The served passes of N from `since` to `until` (ns): medians of the pass, the gap, the loop's work in a pass."""
    passes = [p for p in data["passes"] if since <= p[0] < until]
    loop = sorted((a, b) for a, b in data["loop"] if b >= since and a < until)
    batched = [p for p in passes if p[2] == n]
    first_pass = batched[0][0] if batched else since
    # (the admission's prefills: those before the round's first pass of N, not its passes)
    admitted = [(b - a) / 1e6 for a, b, t in data["prefills"] if since <= a < first_pass and t != n]
    admitted_tokens = [t for a, _, t in data["prefills"] if since <= a < first_pass and t != n]

    def loop_in(a: int, b: int) -> float:
        return sum(max(0, min(b, hi) - max(a, lo)) for lo, hi in loop if hi > a and lo < b) / 1e6

    gaps = []
    for prev, nxt in zip(passes, passes[1:]):
        if prev[2] == n and nxt[2] == n and nxt[0] - prev[1] < 200e6:  # (the same round)
            gaps.append((nxt[0] - prev[1]) / 1e6)
    med = statistics.median
    return {
        "wall": med((p[1] - p[0]) / 1e6 for p in batched),
        "cpu": med(p[3] / 1e6 for p in batched),
        "gap": med(gaps) if gaps else 0.0,
        "loop": med(loop_in(p[0], p[1]) for p in batched),
        "probes": float(sum(1 for p in passes if p[2] == 1)),  # (a lone sequence 0 decodes through the engine)
        "probe_ms": med((p[1] - p[0]) / 1e6 for p in passes if p[2] == 1) if any(p[2] == 1 for p in passes) else 0.0,
        "passes": float(len(batched)),
        "engine_tid": float(batched[0][4]) if batched else 0.0,
        "prefill0_ms": admitted[0] if admitted else 0.0,
        "prefill0_tokens": float(admitted_tokens[0]) if admitted else 0.0,
        "joint_ms": sum(admitted[1:]),
        "joint_tokens": float(sum(admitted_tokens[1:])),
    }


def clients_made(n: int) -> float:
    """CPU seconds of making and closing N httpx clients (together() makes them before its
    barrier, ~25 ms each for their certificates): taken off the clients' CPU."""
    import httpx

    t0 = time.process_time()
    for client in [httpx.Client(timeout=300) for _ in range(n)]:
        client.close()
    return time.process_time() - t0


def one_round(server: Any, engine: Any, prompt: list[int], n: int, args: argparse.Namespace) -> dict[str, float]:
    """The bare batch of N, then N clients: every figure of one round."""
    from serve_batch import together

    bare_wall, bare_cpu = bare_passes(engine, prompt, n, args.tokens)
    pid = server.proc.pid
    before, since = thread_cpu(pid), time.perf_counter_ns()
    client0 = time.process_time()
    rate, ttft, steady = together(server.url, n, args.tokens, args.extension == "on")
    until = time.perf_counter_ns()  # (CLOCK_MONOTONIC, as the server's stamps)
    client = time.process_time() - client0 - clients_made(n)
    after = thread_cpu(pid)
    tokens = n * args.tokens
    used = {tid: (after[tid] - before.get(tid, 0)) / 1e6 / tokens for tid in after}
    return {
        "bare_wall": bare_wall,
        "bare_cpu": bare_cpu,
        "rate": rate,
        "steady": steady,
        "ttft": max(ttft),
        "client": client * 1000.0 / tokens,
        "since": float(since),
        "until": float(until),
        "load": os.getloadavg()[0],
        **{f"tid{tid}": ms for tid, ms in used.items()},
    }


def report(n: int, rounds: list[dict[str, float]], data: dict[str, Any], loop_tid: int) -> None:
    parts = [served_parts(data, n, int(r["since"]), int(r["until"])) for r in rounds]
    med = statistics.median

    def m(key: str, rows: list[dict[str, float]]) -> float:
        return med(r.get(key, 0.0) for r in rows)

    engine_tid = int(parts[-1]["engine_tid"])
    tids = {k for r in rounds for k in r if k.startswith("tid")}
    by_tid = {k: m(k, rounds) for k in tids}
    llama = sorted((k for k in tids if k != f"tid{loop_tid}"), key=lambda k: -by_tid[k])[:2]
    worker = next((k for k in llama if k != f"tid{engine_tid}"), "")
    rest = sum(v for k, v in by_tid.items() if k not in (f"tid{engine_tid}", worker, f"tid{loop_tid}"))
    bare, wall = m("bare_wall", rounds), m("wall", parts)
    gap = m("gap", parts)
    print(
        f"\nN = {n}: {len(rounds)} rounds, load {min(r['load'] for r in rounds):.1f}-{max(r['load'] for r in rounds):.1f}"
    )
    print(f"  bare pass            {bare:7.2f} ms wall, {m('bare_cpu', rounds):6.2f} ms CPU (the calling thread)")
    print(
        f"  served pass          {wall:7.2f} ms wall, {m('cpu', parts):6.2f} ms CPU (the engine thread): {wall / bare:.2f}x the bare pass"
    )
    print(f"  gap between passes   {gap:7.2f} ms (the engine thread's Python; {gap / bare:.1%} of a bare pass)")
    print(f"  loop in a pass       {m('loop', parts):7.2f} ms of the event loop's callbacks")
    probes, probe_ms, count = m("probes", parts), m("probe_ms", parts), m("passes", parts)
    share = probes * probe_ms / (count * (wall + gap) + probes * probe_ms) if count else 0.0
    print(
        f"  probes               {probes:7.0f} a round of {count:.0f} passes of {n}, {probe_ms:.2f} ms each: "
        f"{share:.1%} of the round's passes and gaps"
    )
    print(f"  (pass + gap) / bare  {(wall + gap) / bare:7.2f}x; served tok/s while all run {m('steady', rounds):.1f}, "
          f"bare {n * 1000.0 / bare:.1f} (its median pass)")  # fmt: skip
    print(
        f"  admission          sequence 0's prefill {m('prefill0_tokens', parts):.0f} tokens {m('prefill0_ms', parts):.1f} ms, "
        f"the joint prefill {m('joint_tokens', parts):.0f} tokens {m('joint_ms', parts):.1f} ms; worst TTFT {m('ttft', rounds):.0f} ms"
    )
    print(
        f"  CPU a token, ms: engine thread {by_tid.get(f'tid{engine_tid}', 0.0):.3f}, OpenMP's worker "
        f"{by_tid.get(worker, 0.0):.3f}, event loop {by_tid.get(f'tid{loop_tid}', 0.0):.3f}, the rest {rest:.3f}; "
        f"the clients' streaming (this process) {m('client', rounds):.3f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4", help="N, comma-separated, each 2 or more")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--extension", default="on", choices=("on", "off"))
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child[0], args.child[1:])
        return
    if any(int(n) < 2 for n in args.sizes.split(",")):  # (one client runs the engine's own pass, no batch's)
        ap.error("--sizes: each N 2 or more (one client alone: serve_batch.py, serve_overhead.py)")
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(HERE))
    from serve_batch import prompt_tokens, together
    from serve_overhead import PY, Child

    from loopchat.engine.engine import Engine
    from loopchat.model_files import builtin_model_path

    with tempfile.TemporaryDirectory() as tmp:
        dump = str(Path(tmp) / "parts.json")
        serve = ["serve", "--port", "0", "--threads", str(args.threads), "--parallel", "8"]
        server = Child([PY, __file__, "--child", dump, *serve], r"listening on (http://\S+)")
        # (the served model's context, models.toml's default: 8 clients of 256 tokens need more than 2048)
        engine = Engine(builtin_model_path(), n_ctx=4096, threads=args.threads)
        rounds: dict[int, list[dict[str, float]]] = {}
        try:
            prompt = prompt_tokens(engine)
            together(server.url, 1, 4)  # (a warm-up)
            for _ in range(args.rounds):
                for n in (int(x) for x in args.sizes.split(",")):
                    rounds.setdefault(n, []).append(one_round(server, engine, prompt, n, args))
        finally:
            engine.close()
            server.stop()
        data = json.loads(Path(dump).read_text())
    print(
        f"loopchat serve --parallel 8, {args.threads} threads, {args.tokens} tokens a client, the extension {args.extension}"
    )
    for n, got in rounds.items():
        report(n, got, data, server.proc.pid)


if __name__ == "__main__":
    main()
