"""`loopchat serve` against llama.cpp's own `llama-server` (issue 25, item 0), side by side.

Both servers run the default model on 2 threads (--threads), each with flash attention as
its default ("auto" for both: llama.cpp resolves it to on, on the CPU) and then both with it
off (`--flash-attn off` / `-fa off`). Each round starts a fresh server of each kind (in
alternating order) and makes --requests streamed chat requests to it, one at a time, with
logprobs and top_logprobs=5, the same prompt, seed and sampling settings (temperature 0.7,
top_k 40, top_p 0.95, min_p 0.05, no repeat penalty: llama-server's own defaults, sent to
both), max_tokens --tokens and ignore_eos (both servers take it), so both write replies of
the same length. Measured at the client as benchmarks/serve_overhead.py does
(`stream_request`: decode tok/s = (token chunks - 1) / (last chunk's arrival - first's);
TTFT from sending to the first token chunk). The first request of each server warms it and
is not counted. Printed per setting: the medians, and loopchat/llama-server per round and
their median: the target is >= 1.0.

llama-server is built from the llama.cpp source vendored in the pinned llama-cpp-python
(benchmarks/build_llama_bench.sh llama-server, as tests/remote_servers.py does).

    .venv/bin/python benchmarks/serve_vs_llama_server.py [--rounds 3] [--requests 3] [--tokens 128]
        [--threads 2] [--settings default,off] [--busy 0]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serve_overhead import PROMPT, SEED, SYSTEM, Child, cpu_burners, loopchat_serve, stream_request  # noqa: E402

from loopchat.model_files import builtin_model_path  # noqa: E402

SAMPLING = {"temperature": 0.7, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0}


def llama_server_binary() -> str:
    out = subprocess.run(
        ["bash", str(HERE / "build_llama_bench.sh"), "llama-server"], capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()[-1]


def llama_server(binary: str, model: Path, threads: int, flash_attn: str) -> Child:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fa = [] if flash_attn == "default" else ["-fa", flash_attn]
    args = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-t", str(threads)]
    args += ["-tb", str(threads), "-np", "1", *fa]
    return Child(args, r"(listening on http://)", url=f"http://127.0.0.1:{port}")


def loopchat(threads: int, flash_attn: str) -> Child:
    return loopchat_serve(threads, *([] if flash_attn == "default" else ["--flash-attn", flash_attn]))


def body(tokens: int) -> dict:
    return {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}],
        "stream": True,
        "max_tokens": tokens,
        "seed": SEED,
        "logprobs": True,
        "top_logprobs": 5,
        "ignore_eos": True,
        **SAMPLING,
    }


def measure(server: Child, requests: int, tokens: int) -> list[dict]:
    stream_request(server.url, body(16))  # warm-up: not counted
    return [stream_request(server.url, body(tokens)) for _ in range(requests)]


def fa_line(server: Child) -> str:
    """What the server's log says about flash attention (llama-server's own lines)."""
    lines = [ln.strip() for ln in server.lines if "Flash Attention" in ln or "flash_attn " in ln]
    return " | ".join(lines[:2])


def compare(setting: str, args: argparse.Namespace, binary: str) -> dict:
    model = builtin_model_path("smollm2-135m-instruct")
    runs: dict[str, list[dict]] = {"loopchat": [], "llama-server": []}
    per_round = []
    for r in range(args.rounds):
        kinds = ("loopchat", "llama-server") if r % 2 == 0 else ("llama-server", "loopchat")
        rates = {}
        for kind in kinds:
            server = (
                loopchat(args.threads, setting)
                if kind == "loopchat"
                else llama_server(binary, model, args.threads, setting)
            )
            try:
                got = measure(server, args.requests, args.tokens)
                if kind == "llama-server" and r == 0:
                    print(f"  llama-server {setting}: {fa_line(server)}", flush=True)
            finally:
                server.stop()
            runs[kind] += got
            rates[kind] = statistics.median(g["tok_s"] for g in got)
            print(f"  {setting} round {r + 1} {kind}: {json.dumps(got)}", flush=True)
        per_round.append(rates["loopchat"] / rates["llama-server"])
    med = {k: {m: statistics.median(g[m] for g in v) for m in ("tok_s", "ttft_ms", "tokens")} for k, v in runs.items()}
    return {"setting": setting, "median": med, "ratio_per_round": per_round, "ratio": statistics.median(per_round)}


def against_llama_server(threads: int, rounds: int, tokens: int, requests: int = 3, busy: int = 0) -> list[dict]:
    """Both servers side by side (serve_overhead.py --llama-server calls this too)."""
    args = argparse.Namespace(threads=threads, rounds=rounds, tokens=tokens, requests=requests, busy=busy)
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
                f"flash attention {setting:7} threads {args.threads}: loopchat serve {lc['tok_s']:.1f} tok/s "
                f"(TTFT {lc['ttft_ms']:.0f} ms) · llama-server {ls['tok_s']:.1f} tok/s (TTFT {ls['ttft_ms']:.0f} ms) · "
                f"ratio {res['ratio']:.3f} (per round {', '.join(f'{x:.3f}' for x in res['ratio_per_round'])}) · "
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
    args = ap.parse_args()
    print(json.dumps(run_all(args, args.settings)))


if __name__ == "__main__":
    main()
