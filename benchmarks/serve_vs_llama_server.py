"""`loopchat serve` against llama.cpp's own `llama-server` (issue 25, item 0), side by side.

Both servers run the default model on 2 threads (--threads), each with flash attention as
its default ("auto" for both: llama.cpp resolves it to on, on the CPU) and then both with it
off (`--flash-attn off` / `-fa off`). In each round both servers are started fresh and
stay up, and --requests streamed chat requests alternate between them, one at a time (the
first to each warms it and is not counted): on a shared machine whose load moves by the
second, the two requests of a pair met the same load. Each request: logprobs and
top_logprobs=5, the same prompt, seed and sampling settings (temperature 0.7, top_k 40,
top_p 0.95, min_p 0.05, no repeat penalty, no DRY: llama-server's own defaults, sent to both:
loopchat's bundled model defaults to DRY 0.8, which llama-server does not run unless asked),
max_tokens --tokens and ignore_eos (both servers take it), so both write replies of the
same length. Equal otherwise too (checked, eighth session): the same 32 prompt tokens (both
render the GGUF's ChatML template), the same chain order (penalties, DRY, top-k, top-p,
min-p, temperature, draw), f16 KV cache in both, threads and threads_batch --threads, and
the same number of slots (--parallel: loopchat's `--parallel N`, llama-server's `-np N`, with
`-kvu` above 1: one KV cache shared by the slots, as loopchat's; 4 is both servers' default).
loopchat's `loopchat` extension (the Step's whole record, ~2 KB a chunk) is off
(`"loopchat": false`), llama-server having nothing like it; `--extension on` sends it. Measured at the client as benchmarks/serve_overhead.py does (`stream_request`:
decode tok/s = (token chunks - 1) / (last chunk's arrival - first's); TTFT from sending to
the first token chunk), and the server process's CPU time per token. Printed per setting:
the medians, loopchat/llama-server's decode tok/s per pair of requests and its median (the
target is >= 1.0) with a 95% interval for that median (`median_ci`: a median of 8 pairs decides
little on a shared machine; `--requests 8` gives 16), and each one's CPU time per token (llama-server's / loopchat's >= 1.0:
loopchat does the same work with no more CPU).

The weights' pages (`--pages`): each server's own by default, loopchat's model in 2 MB pages
(engine/huge_pages.py), llama-server's file mapped (4 KB pages); `--pages 4k` runs loopchat with
LOOPCHAT_HUGE_PAGES=0 (the file mapped, as llama-server), `--pages 2m` runs llama-server with
`--load-mode none` and GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (its weights in 2 MB pages too); each
round's first line says how many MB of each server are in 2 MB pages.

llama-server is built from the llama.cpp source vendored in the pinned llama-cpp-python
(benchmarks/build_llama_bench.sh llama-server, as tests/remote_servers.py does).

    .venv/bin/python benchmarks/serve_vs_llama_server.py [--rounds 3] [--requests 3] [--tokens 128]
        [--threads 2] [--settings default,off] [--busy 0] [--parallel 4] [--extension off]
        [--pages own|4k|2m]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serve_overhead import Child, chat_body, cpu_burners, loopchat_serve, stream_request  # noqa: E402

from loopchat.engine.huge_pages import proc_bytes  # noqa: E402
from loopchat.model_files import builtin_model_path  # noqa: E402

SAMPLING = {"temperature": 0.7, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0, "dry_multiplier": 0.0}


def llama_server_binary() -> str:
    out = subprocess.run(
        ["bash", str(HERE / "build_llama_bench.sh"), "llama-server"], capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """os.environ with `values` set while a child starts (Child passes os.environ on)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def huge_mb(server: Child) -> int:
    """The server process's memory in 2 MB pages (AnonHugePages), MB."""
    return proc_bytes(f"/proc/{server.proc.pid}/smaps_rollup", "AnonHugePages") >> 20


def llama_server(
    binary: str, model: Path, threads: int, flash_attn: str, parallel: int = 4, pages: str = "own"
) -> Child:
    """pages "2m": the model read, not mapped (`--load-mode none`), glibc asked to advise its large
    blocks MADV_HUGEPAGE (GLIBC_TUNABLES=glibc.malloc.hugetlb=1): its weights in 2 MB pages, as loopchat's."""
    huge = pages == "2m"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fa = [] if flash_attn == "default" else ["-fa", flash_attn]
    args = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-t", str(threads)]
    args += ["-tb", str(threads), "-np", str(parallel), *(["-kvu"] if parallel > 1 else []), *fa]
    args += ["--load-mode", "none"] if huge else []
    with environ(**({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"} if huge else {})):
        return Child(args, r"(listening on http://)", url=f"http://127.0.0.1:{port}")


def loopchat(threads: int, flash_attn: str, parallel: int = 4, pages: str = "own") -> Child:
    """pages "4k": the file mapped as llama.cpp maps it (LOOPCHAT_HUGE_PAGES=0), as llama-server's own."""
    fa = [] if flash_attn == "default" else ["--flash-attn", flash_attn]
    with environ(**({"LOOPCHAT_HUGE_PAGES": "0"} if pages == "4k" else {})):
        return loopchat_serve(threads, "--parallel", str(parallel), *fa)


def body(tokens: int, extension: bool = False) -> dict:
    """serve_overhead's chat body with the top 5, the settings sent to both, no usage chunk,
    loopchat's extension off unless asked (llama-server sends nothing like it)."""
    b = chat_body(tokens, top_logprobs=5, ignore_eos=True, **SAMPLING)
    del b["stream_options"]
    if not extension:
        b["loopchat"] = False
    return b


def timed(server: Child, tokens: int, extension: bool = False) -> dict:
    """One request, with the server process's CPU time spent on it per token (user + system:
    on a shared machine a wall clock measures the others' load too; at 1 thread, where no
    llama.cpp thread waits for another, the CPU time is the work done)."""
    proc = psutil.Process(server.proc.pid)
    before = proc.cpu_times()
    got = stream_request(server.url, body(tokens, extension))
    after = proc.cpu_times()
    cpu = (after.user - before.user) + (after.system - before.system)
    got["cpu_ms_per_token"] = cpu * 1000.0 / got["tokens"]
    return got


def fa_line(server: Child) -> str:
    """What the server's log says about flash attention (llama-server's own lines)."""
    lines = [ln.strip() for ln in server.lines if "Flash Attention" in ln or "flash_attn " in ln]
    return " | ".join(lines[:2])


METRICS = ("tok_s", "ttft_ms", "tokens", "cpu_ms_per_token")


def median_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free interval for the median of the pairs' ratios (order statistics: the
    k-th smallest and k-th largest of n, k the largest with a binomial(n, 1/2) coverage of at
    least `confidence`) and its coverage. With 8 pairs (the issue's `--rounds 2 --requests 4`) it
    is their whole range (the 2nd smallest to the 2nd largest cover only 93%); with 16, the 4th
    to the 13th (98%). On a shared machine one request of a pair can stall, so the median of a
    few pairs says little; the interval says how little (docs/performance.md, tenth session)."""
    xs, n = sorted(values), len(values)
    below = [math.comb(n, i) / 2**n for i in range(n + 1)]  # P(binomial(n, 1/2) = i)
    k, coverage = 1, 1.0 - 2 * below[0]
    while k < n // 2 and 1.0 - 2 * sum(below[: k + 1]) >= confidence:  # (coverage of the next k)
        k += 1
        coverage = 1.0 - 2 * sum(below[:k])
    return xs[k - 1], xs[n - k], coverage


def compare(setting: str, args: argparse.Namespace, binary: str) -> dict:
    """Rounds of both servers up at once, requests alternating between them (one at a time)."""
    model = builtin_model_path("smollm2-135m-instruct")
    runs: dict[str, list[dict]] = {"loopchat": [], "llama-server": []}
    pairs = []
    for r in range(args.rounds):
        servers = {"loopchat": loopchat(args.threads, setting, args.parallel, args.pages)}
        try:
            servers["llama-server"] = llama_server(binary, model, args.threads, setting, args.parallel, args.pages)
            if r == 0:
                print(f"  llama-server {setting}: {fa_line(servers['llama-server'])}", flush=True)
                print(f"  2 MB pages (MB): {', '.join(f'{k} {huge_mb(v)}' for k, v in servers.items())}", flush=True)
            for server in servers.values():
                stream_request(server.url, body(16, args.extension == "on"))  # warm-up: not counted
            for i in range(args.requests):
                order = ("loopchat", "llama-server") if (r + i) % 2 == 0 else ("llama-server", "loopchat")
                got = {kind: timed(servers[kind], args.tokens, args.extension == "on") for kind in order}
                for kind in order:
                    runs[kind].append(got[kind])
                pairs.append({m: got["loopchat"][m] / got["llama-server"][m] for m in ("tok_s", "cpu_ms_per_token")})
                print(f"  {setting} round {r + 1} request {i + 1}: {json.dumps(got)}", flush=True)
        finally:
            for server in servers.values():
                server.stop()
    med = {k: {m: statistics.median(g[m] for g in v) for m in METRICS} for k, v in runs.items()}
    return {
        "setting": setting,
        "median": med,
        "ratio_per_request": [p["tok_s"] for p in pairs],
        "ratio": statistics.median(p["tok_s"] for p in pairs),
        "ratio_ci": median_ci([p["tok_s"] for p in pairs]),
        "cpu_ratio": statistics.median(p["cpu_ms_per_token"] for p in pairs),
    }


def against_llama_server(threads: int, rounds: int, tokens: int, requests: int = 3, busy: int = 0) -> list[dict]:
    """Both servers side by side (serve_overhead.py --llama-server calls this too)."""
    args = argparse.Namespace(
        threads=threads,
        rounds=rounds,
        tokens=tokens,
        requests=requests,
        busy=busy,
        parallel=4,
        extension="off",
        pages="own",
    )
    return run_all(args, "default,off")


def run_all(args: argparse.Namespace, settings: str) -> list[dict]:
    binary = llama_server_binary()
    results = []
    with cpu_burners(args.busy, seconds=7200) if args.busy else contextlib.nullcontext():
        for setting in settings.split(","):
            res = compare(setting, args, binary)
            results.append(res)
            lc, ls = res["median"]["loopchat"], res["median"]["llama-server"]
            print(
                f"flash attention {setting:7} threads {args.threads} parallel {args.parallel} extension "
                f"{args.extension} pages {args.pages}: loopchat serve {lc['tok_s']:.1f} tok/s "
                f"(TTFT {lc['ttft_ms']:.0f} ms) · llama-server {ls['tok_s']:.1f} tok/s (TTFT {ls['ttft_ms']:.0f} ms) · "
                f"ratio {res['ratio']:.3f} ({res['ratio_ci'][2]:.0%} interval of the median "
                f"{res['ratio_ci'][0]:.3f}-{res['ratio_ci'][1]:.3f}; per request "
                f"{', '.join(f'{x:.2f}' for x in res['ratio_per_request'])}) · "
                f"CPU per token {lc['cpu_ms_per_token']:.2f} / {ls['cpu_ms_per_token']:.2f} ms "
                f"(llama-server/loopchat {1 / res['cpu_ratio']:.3f}) · "
                f"load avg {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--settings", default="default,off", help="flash attention: default (each its own), on, off")
    ap.add_argument("--busy", type=int, default=0, help="beside N CPU-bound processes")
    ap.add_argument("--parallel", type=int, default=4, help="slots of both servers (4: both servers' default)")
    ap.add_argument("--extension", default="off", choices=("on", "off"), help="loopchat's extension in the chunks")
    ap.add_argument(
        "--pages",
        default="own",
        choices=("own", "4k", "2m"),
        help="the weights' pages: own (each server's default: loopchat's 2 MB, llama-server's mapped file), "
        "4k (loopchat's as llama-server's), 2m (llama-server's as loopchat's)",
    )
    args = ap.parse_args()
    print(json.dumps(run_all(args, args.settings)))


if __name__ == "__main__":
    main()
