"""`loopchat serve` from two (or more) source trees and llama-server, side by side: each
server's CPU per token, by thread.

All the servers are up at once and the streamed requests go round them in turn, the first
of each round starting one further on (the same request as benchmarks/serve_vs_llama_server.py:
128 tokens, ignore_eos, top_logprobs 5, llama-server's default sampling sent to all, loopchat's
extension off unless --extension on; every server with --parallel slots). For
each request: the client's decode tok/s, the server process's CPU time per token (its
threads' schedstat), its main thread's (loopchat: the event loop that serializes and sends the
chunks) and its busiest thread's (loopchat: the engine thread; llama-server: the one that
runs the passes and samples), and the others' (loopchat: llama.cpp's second thread, the
hand-off thread until the eleventh session). Printed: the medians per server and, against the first, the median of the
per-round ratios. A tree is a folder with `src/loopchat` (e.g.
`git archive <commit> | tar -x -C /tmp/base`, and the built sampler kernel copied into its
`src/loopchat/engine/`): its server runs with PYTHONPATH=<tree>/src, the venv's packages
otherwise. At 1 llama thread no thread waits at a barrier, so the CPU per token is the
work done (docs/performance.md, "`loopchat serve`'s per-token cost").

    .venv/bin/python benchmarks/serve_cpu_trees.py --tree base=/tmp/base --tree new=. [--llama-server]
        [--threads 1] [--flash-attn on] [--requests 8] [--tokens 128] [--parallel 4] [--extension off]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serve_overhead import PY, Child, stream_request  # noqa: E402
from serve_vs_llama_server import body, environ, llama_server, llama_server_binary  # noqa: E402

from loopchat.model_files import builtin_model_path  # noqa: E402


def loopchat_from(tree: Path, threads: int, flash_attn: str, parallel: int = 4) -> Child:
    args = [PY, "-m", "loopchat", "serve", "--port", "0", "--threads", str(threads), "--flash-attn", flash_attn]
    args += ["--parallel", str(parallel)]
    with environ(PYTHONPATH=str(tree / "src")):  # (Child passes os.environ on)
        return Child(args, r"listening on (http://\S+)")


def thread_ns(pid: int) -> dict[int, int]:
    """Each thread's time on a CPU in ns (/proc/PID/task/TID/schedstat's first field: the
    scheduler's own sum, exact; /proc's stat counts clock ticks of 10 ms, which at ~0.3 ms a
    token and 128 tokens is a quarter of the figure)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # (a thread that ended meanwhile)
            pass
    return out


def switches(pid: int) -> tuple[int, int]:
    """The main thread's voluntary and involuntary context switches so far (/proc's status)."""
    counts = dict.fromkeys(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"), 0)
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in counts:
            counts[key] = int(value)
    return counts["voluntary_ctxt_switches"], counts["nonvoluntary_ctxt_switches"]


def measured(server: Child, request: dict) -> dict:
    """One request: client tok/s, and CPU ms per token of the process, its main thread, its
    busiest, the others (threads' times from schedstat); the main thread's context switches
    per token, voluntary and not (loopchat: the event loop's sleeps in epoll and on the GIL)."""
    pid = server.proc.pid
    before, sw0 = thread_ns(pid), switches(pid)
    got = stream_request(server.url, request)
    after, sw1 = thread_ns(pid), switches(pid)
    per_thread = {tid: (ns - before.get(tid, 0)) / 1e6 / got["tokens"] for tid, ns in after.items()}
    cpu = sum(per_thread.values())
    main = per_thread.get(pid, 0.0)
    top = max(per_thread, key=per_thread.__getitem__)  # (llama-server: its main thread)
    rest = sum(ms for tid, ms in per_thread.items() if tid not in (pid, top))
    return {
        "tok_s": got["tok_s"],
        "ttft_ms": got["ttft_ms"],
        "cpu_ms": cpu,
        "main_ms": main,
        "busiest_ms": per_thread[top],
        "rest_ms": rest,
        "main_vol": (sw1[0] - sw0[0]) / got["tokens"],
        "main_invol": (sw1[1] - sw0[1]) / got["tokens"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH of a source tree (repeat)")
    ap.add_argument("--llama-server", action="store_true", help="llama-server beside them")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--flash-attn", default="on", choices=("on", "off"))
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--parallel", type=int, default=4, help="every server's slots (4: their default)")
    ap.add_argument("--extension", default="off", choices=("on", "off"), help="loopchat's extension in the chunks")
    args = ap.parse_args()
    servers: dict[str, Child] = {}
    try:
        if args.llama_server:
            model = builtin_model_path("smollm2-135m-instruct")
            binary = llama_server_binary()
            servers["llama-server"] = llama_server(binary, model, args.threads, args.flash_attn, args.parallel)
        for spec in args.tree:
            name, _, path = spec.partition("=")
            servers[name] = loopchat_from(Path(path).resolve(), args.threads, args.flash_attn, args.parallel)
        extension = args.extension == "on"
        warm = body(16, extension)
        for server in servers.values():
            stream_request(server.url, warm)  # not counted
        names, request = list(servers), body(args.tokens, extension)
        runs: dict[str, list[dict]] = {n: [] for n in names}
        for i in range(args.requests):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                runs[name].append(measured(servers[name], request))
    finally:
        for server in servers.values():
            server.stop()
    first = names[0]
    print(
        f"threads {args.threads} · flash attention {args.flash_attn} · {args.requests} requests of {args.tokens} "
        f"tokens each · parallel {args.parallel} · extension {args.extension} · load average {os.getloadavg()[0]:.1f}"
    )
    for name in names:
        r = runs[name]
        ratio = statistics.median(a["tok_s"] / b["tok_s"] for a, b in zip(r, runs[first]))
        med = {k: statistics.median(x[k] for x in r) for k in r[0]}
        print(
            f"  {name:14} {med['tok_s']:6.1f} tok/s ({ratio:.3f} of {first}'s) · CPU per token {med['cpu_ms']:6.2f} ms"
            f" · main thread {med['main_ms']:5.2f} · busiest thread {med['busiest_ms']:6.2f} · the others {med['rest_ms']:5.2f}"
            f" · TTFT {med['ttft_ms']:6.1f} ms · main thread's switches a token {med['main_vol']:.2f} / {med['main_invol']:.2f}"
        )


if __name__ == "__main__":
    main()
