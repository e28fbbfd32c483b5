"""What does the wire cost? `loopchat serve` against `loopchat run`, side by side in one run.

Each round starts, in alternating order, fresh processes of:
(a) `loopchat run` headless: one reply, its figures from its trace (the engine's own
    clock: TTFT from the request to the first token, decode tok/s from the first token
    to the last);
(b) `loopchat serve`: one streaming request from a lean client here (httpx; each event
    time-stamped as it arrives, only the finish chunk parsed) with logprobs and
    top_logprobs=10 (the `loopchat` extension on, as by default): TTFT from sending the
    request to the first token's chunk arriving, decode tok/s = (chunks - 1) / (last
    token chunk's arrival - first one's). Then --more short requests with
    cache_prompt false (a whole prefill each): the wire's share of TTFT, the client's
    TTFT minus the server engine's own TTFT for the same request (from the extension);
(c) for reference, llama-cpp-python's own server (`python -m llama_cpp.server`, its
    default logits_all) with logprobs and top_logprobs=10, measured the same way.
(a) and (b) run the same prompt, settings, seed and pinned threads, each in a fresh
process (no KV cache to reuse), so they draw the very same tokens; (c) samples with
its own code (its token count is printed).

Targets: (b) decode / (a) decode >= 0.95; (b) TTFT within +5 ms of (a). Fresh processes
differ by ±10 ms in their first prefill, so the TTFT is judged twice: the medians of
(b) and (a), and the wire's share within one server (what HTTP adds to the same loop).

With --llama-server: loopchat serve against llama.cpp's own llama-server, at equal threads
and settings, with logprobs (benchmarks/serve_vs_llama_server.py: both printed, and their ratio).

Then a soak on one fresh server: --soak sequential requests (chat and completions,
streamed and blocking, with logprobs), then --clients concurrent clients making
--per-client streamed requests each: no error; the server's RSS after all of them within
+10% of its RSS after the first request.

    .venv/bin/python benchmarks/serve_overhead.py [--rounds 5] [--tokens 256] [--threads 2]
        [--no-llama-cpp] [--soak 200] [--clients 8] [--per-client 5] [--skip-rounds]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cpu_burners import cpu_burners  # noqa: E402

from loopchat.events import Finish  # noqa: E402
from loopchat.model_files import builtin_model_path  # noqa: E402
from loopchat.trace import read_trace  # noqa: E402

PY = sys.executable
SYSTEM = "You are a helpful assistant."
PROMPT = "Write a long story about a lighthouse keeper and a storm."
SEED = 7
#: The settings loopchat uses for the bundled model (models.toml's), sent to llama-cpp-python too.
LLAMA_CPP_SETTINGS = {"temperature": 0.2, "top_p": 0.9, "top_k": 50, "min_p": 0.0, "repeat_penalty": 1.0}


class Child:
    """A server process; `url` once the line `pattern` appeared on its stdout or stderr."""

    def __init__(self, args: list[str], pattern: str, url: str | None = None, timeout: float = 180) -> None:
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        ready = threading.Event()
        found: list[str] = []

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
                m = re.search(pattern, line)
                if m and not found:
                    found.append(m.group(1) if m.groups() else "")
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout) or not found:
            self.stop()
            raise RuntimeError(f"{args[:4]} did not start: {''.join(self.lines)[-1500:]}")
        self.url = url or found[0]

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def loopchat_serve(threads: int, *extra: str) -> Child:
    return Child(
        [PY, "-m", "loopchat", "serve", "--port", "0", "--threads", str(threads), *extra], r"listening on (http://\S+)"
    )


def llama_cpp_server(model: Path, threads: int) -> Child:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return Child(
        [
            PY,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_threads",
            str(threads),
            "--n_threads_batch",
            str(threads),
            "--n_ctx",
            "4096",
        ],
        r"(Uvicorn running on)",
        url=f"http://127.0.0.1:{port}",
    )


_TOKEN_CHUNK = re.compile(r'"finish_reason":\s*null')
_NO_CHOICES = re.compile(r'"choices":\s*\[\]')


def stream_request(url: str, body: dict) -> dict:
    """One streaming chat request: client TTFT, decode tok/s and the chunk count.

    A lean client: each event is time-stamped as it arrives and told apart by its text
    (the first is the role chunk; a token chunk has finish_reason null; the usage chunk
    no choices); only the finish chunk is parsed (its `loopchat` extension, if any, has
    the server engine's own figures). Parsing every ~2 KB chunk would put the client's
    CPU on the 2 cores the model's threads use."""
    times: list[float] = []
    finish: dict = {}
    done = False
    seen = 0
    with httpx.Client(timeout=300) as client:  # (its creation, ~20 ms of TLS set-up, is not timed)
        sent = time.perf_counter()
        with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                seen += 1
                if line == "data: [DONE]":
                    done = True
                    break
                if seen == 1 or _NO_CHOICES.search(line):  # the role chunk, the usage chunk
                    continue
                if _TOKEN_CHUNK.search(line):
                    times.append(time.perf_counter())
                else:
                    finish = (json.loads(line[6:]).get("loopchat") or {}).get("finish") or {}
    if not done or len(times) < 2:
        raise RuntimeError(
            f"the stream ended early ({len(times)} token chunks, [DONE] {'seen' if done else 'missing'})"
        )
    return {
        "ttft_ms": (times[0] - sent) * 1000.0,
        "tok_s": (len(times) - 1) / (times[-1] - times[0]),
        "tokens": len(times),
        "server_ttft_ms": finish.get("ttft_ms"),  # a loopchat server's engine's own figures for this request
        "server_tok_s": finish.get("tokens_per_s"),
    }


def chat_body(tokens: int, **extra: object) -> dict:
    return {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}],
        "stream": True,
        "max_tokens": tokens,
        "seed": SEED,
        "logprobs": True,
        "top_logprobs": 10,
        "stream_options": {"include_usage": True},
        **extra,
    }


def run_headless(threads: int, tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "run.jsonl"
        proc = subprocess.run(
            [
                PY,
                "-m",
                "loopchat",
                "run",
                "--threads",
                str(threads),
                "--seed",
                str(SEED),
                "--max-tokens",
                str(tokens),
                "--top-report",
                "10",
                "--system",
                SYSTEM,
                "--trace",
                str(trace),
                PROMPT,
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"loopchat run failed: {proc.stderr[-1000:]}")
        _, traced = read_trace(trace)
        finish = [t.event for t in traced if isinstance(t.event, Finish)][-1]
    return {"ttft_ms": finish.ttft_ms, "tok_s": finish.tokens_per_s, "tokens": finish.completion_tokens}


def run_served(threads: int, tokens: int, more: int) -> dict:
    """The first request to a fresh server (as `loopchat run` is a fresh process), then
    `more` short ones with cache_prompt false (each a whole prefill) for the wire's share
    of the TTFT: the client's TTFT minus the server engine's own for the same request."""
    server = loopchat_serve(threads)
    try:
        first = stream_request(server.url, chat_body(tokens))
        again = [stream_request(server.url, chat_body(8, cache_prompt=False)) for _ in range(more)]
    finally:
        server.stop()
    first["wire_ms"] = [x["ttft_ms"] - x["server_ttft_ms"] for x in [first, *again]]
    return first


def run_llama_cpp(model: Path, threads: int, tokens: int) -> dict:
    server = llama_cpp_server(model, threads)
    try:
        return stream_request(server.url, chat_body(tokens, model="x", **LLAMA_CPP_SETTINGS))
    finally:
        server.stop()


def rounds(args: argparse.Namespace, model: Path) -> None:
    kinds = ["headless", "serve"] + ([] if args.no_llama_cpp else ["llama-cpp"])
    res: dict[str, list[dict]] = {k: [] for k in kinds}
    print(
        f"{args.rounds} rounds, {args.tokens} tokens at most, threads {args.threads} pinned; "
        f"each configuration a fresh process, order alternating",
        flush=True,
    )
    for r in range(args.rounds):
        order = kinds if r % 2 == 0 else list(reversed(kinds))
        for k in order:
            if k == "headless":
                x = run_headless(args.threads, args.tokens)
            elif k == "serve":
                x = run_served(args.threads, args.tokens, args.more)
            else:
                x = run_llama_cpp(model, args.threads, args.tokens)
            res[k].append(x)
            extra = ""
            if x.get("server_ttft_ms") is not None:
                extra = (
                    f"  (its engine: {x['server_tok_s']:.1f} tok/s, TTFT {x['server_ttft_ms']:.1f} ms; the wire's "
                    f"share of TTFT {statistics.median(x['wire_ms']):.1f} ms)"
                )
            print(
                f"round {r + 1}  {k:<10} {x['tok_s']:7.1f} tok/s  TTFT {x['ttft_ms']:6.1f} ms  "
                f"{x['tokens']} tokens{extra}",
                flush=True,
            )
    med = {k: {f: statistics.median(x[f] for x in v) for f in ("tok_s", "ttft_ms")} for k, v in res.items()}
    by_round = [s["tok_s"] / h["tok_s"] for s, h in zip(res["serve"], res["headless"])]
    ttft_diff = [s["ttft_ms"] - h["ttft_ms"] for s, h in zip(res["serve"], res["headless"])]
    wire = [w for s in res["serve"] for w in s["wire_ms"]]
    engine = statistics.median(s["server_tok_s"] for s in res["serve"])
    print()
    print(f"{'':<28}{'decode tok/s':>14}{'TTFT ms':>10}   (medians)")
    for k in kinds:
        print(f"{k:<28}{med[k]['tok_s']:14.1f}{med[k]['ttft_ms']:10.1f}")
    print()
    ratio = med["serve"]["tok_s"] / med["headless"]["tok_s"]
    print(
        f"serve / headless decode: {ratio:.3f} (by round {statistics.median(by_round):.3f}, "
        f"{min(by_round):.3f}-{max(by_round):.3f}; target >= 0.95)"
    )
    print(
        f"  the server's engine / headless: {engine / med['headless']['tok_s']:.3f} (the loop itself, in the "
        f"server); client / the server's engine: {med['serve']['tok_s'] / engine:.3f} (the delivery)"
    )
    print(
        f"TTFT over HTTP - the same request's engine TTFT: median {statistics.median(wire):+.1f} ms, "
        f"p90 {sorted(wire)[int(0.9 * (len(wire) - 1))]:+.1f} ms over {len(wire)} requests (target <= +5 ms)"
    )
    print(
        f"  fresh processes, serve - headless: {med['serve']['ttft_ms'] - med['headless']['ttft_ms']:+.1f} ms "
        f"(medians; by round {statistics.median(ttft_diff):+.1f}, {min(ttft_diff):+.1f} to {max(ttft_diff):+.1f}: "
        "a first prefill after a load varies by ±10 ms)"
    )
    if "llama-cpp" in med:
        print(
            f"llama-cpp-python server / headless decode: {med['llama-cpp']['tok_s'] / med['headless']['tok_s']:.3f} "
            f"(reference; its own sampler, logits_all, logprobs top 10)"
        )


def soak(args: argparse.Namespace) -> None:
    print(
        f"\nsoak: {args.soak} sequential requests, then {args.clients} concurrent clients x {args.per_client} "
        f"(one fresh server, threads {args.threads}, --queue {args.clients})",
        flush=True,
    )
    server = loopchat_serve(args.threads, "--queue", str(args.clients))
    errors: list[str] = []
    n_ok = 0
    lock = threading.Lock()

    def request(client: httpx.Client, i: int) -> None:
        nonlocal n_ok
        kind = i % 4
        tail = f" (request {i})"
        try:
            if kind in (0, 1):
                body = chat_body(16, stream=kind == 0)
                body["messages"][1]["content"] += tail
                if kind == 1:
                    body.pop("stream_options")
                path = "/v1/chat/completions"
            else:
                body = {"prompt": "Once upon a time" + tail, "max_tokens": 16, "logprobs": 5, "stream": kind == 2}
                path = "/v1/completions"
            if body["stream"]:
                with client.stream("POST", server.url + path, json=body) as r:
                    if r.status_code != 200:
                        raise RuntimeError(f"status {r.status_code}: {r.read()[:200]!r}")
                    lines = [line for line in r.iter_lines() if line]
                    if lines[-1] != "data: [DONE]" or any('"error"' in line[:20] for line in lines):
                        raise RuntimeError(f"bad stream end: {lines[-1][:200]}")
            else:
                r = client.post(server.url + path, json=body)
                if r.status_code != 200 or not r.json()["choices"]:
                    raise RuntimeError(f"status {r.status_code}: {r.text[:200]}")
            with lock:
                n_ok += 1
        except Exception as exc:  # counted, the soak goes on
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}")

    try:
        t0 = time.monotonic()
        with httpx.Client(timeout=300) as client:
            request(client, 0)
            rss_first = server.rss()
            for i in range(1, args.soak):
                request(client, i)
        rss_sequential = server.rss()
        t1 = time.monotonic()

        def one_client(c: int) -> None:
            with httpx.Client(timeout=600) as client:
                for j in range(args.per_client):
                    request(client, 1000 + c * 101 + j)

        threads = [threading.Thread(target=one_client, args=(c,)) for c in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rss_after = server.rss()
        t2 = time.monotonic()
    finally:
        server.stop()
    total = args.soak + args.clients * args.per_client
    print(
        f"{n_ok} of {total} requests succeeded, {len(errors)} errors "
        f"({t1 - t0:.0f} s sequential, {t2 - t1:.0f} s concurrent)"
    )
    for e in errors[:5]:
        print("  " + e)
    mb = 1024 * 1024
    print(
        f"server RSS: after the first request {rss_first / mb:.1f} MB, after {args.soak} sequential "
        f"{rss_sequential / mb:.1f} MB, after all {rss_after / mb:.1f} MB: {rss_after / rss_first:.3f}x "
        f"(target <= 1.10)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2, help="pinned llama.cpp threads for every process (default 2)")
    ap.add_argument("--more", type=int, default=4, help="extra short requests per server for the wire's TTFT share")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama-cpp-python's server")
    ap.add_argument(
        "--llama-server",
        action="store_true",
        help="also loopchat serve against llama.cpp's llama-server, flash attention at each one's default and off "
        "(benchmarks/serve_vs_llama_server.py, which builds it)",
    )
    ap.add_argument("--skip-rounds", action="store_true", help="only the soak")
    ap.add_argument("--soak", type=int, default=200, help="sequential requests (0: no soak)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=5)
    ap.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="run everything beside N CPU-bound processes (a busy machine; e.g. --busy 1 --threads 1)",
    )
    args = ap.parse_args()
    model = builtin_model_path()
    print(f"model {model.name}; {os.cpu_count()} CPUs; {args.busy} CPU-bound processes beside", flush=True)
    t0 = time.monotonic()
    with cpu_burners(args.busy, seconds=3600.0):
        if not args.skip_rounds:
            rounds(args, model)
        if args.llama_server:
            from serve_vs_llama_server import against_llama_server

            against_llama_server(args.threads, args.rounds, args.tokens)
        if args.soak:
            soak(args)
    print(f"\n{(time.monotonic() - t0) / 60:.1f} min in all")


if __name__ == "__main__":
    main()
