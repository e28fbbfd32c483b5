"""POST /v1/embeddings on `loopchat serve`: what it costs, and what it costs a reply streaming beside it.

One server (threads auto, as a user runs it). Printed, side by side in one run:
  - the embedding rate: tokens/s over requests of `--inputs` texts of ~300 tokens;
  - the server's RSS before the first embedding and after it (the embedder's second Llama);
  - a reply's decode rate (`--tokens`, ignore_eos, temperature 0.8) alone, and while a client
    embeds without a pause beside it, alternating `--rounds` times; the ratio of the medians.

    .venv/bin/python benchmarks/serve_embeddings.py [--rounds 3] [--tokens 1000] [--inputs 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_overhead import PY, Child  # noqa: E402

TEXT = "The lighthouse keeper climbed the stairs every evening, counting each step as the storm gathered. " * 15


def reply_rate(url: str, tokens: int, seed: int) -> float:
    """A streamed reply's decode rate: (chunks - 1) / (last - first), tok/s."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0.8,
        "seed": seed,
        "stream": True,
        "loopchat": False,
    }
    times = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])


def embed_rate(url: str, inputs: int) -> tuple[float, int]:
    """One request of `inputs` texts: (tokens/s, tokens)."""
    t = time.perf_counter()
    got = httpx.post(url + "/v1/embeddings", json={"input": [TEXT] * inputs}, timeout=600).json()
    n = got["usage"]["prompt_tokens"]
    return n / (time.perf_counter() - t), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--inputs", type=int, default=8)
    args = ap.parse_args()
    server = Child([PY, "-m", "loopchat", "serve", "--port", "0"], r"listening on (http://\S+)")  # (threads auto)
    try:
        proc = psutil.Process(server.proc.pid)
        rss0 = proc.memory_info().rss
        rates = [embed_rate(server.url, args.inputs) for _ in range(3)]
        rss1 = proc.memory_info().rss
        print(f"embedding: {statistics.median(r for r, _ in rates):.0f} tok/s ({rates[0][1]} tokens a request)")
        print(f"server RSS: {rss0 / 1e6:.0f} MB before the first embedding, {rss1 / 1e6:.0f} MB after")
        alone, beside = [], []
        for r in range(args.rounds):
            alone.append(reply_rate(server.url, args.tokens, r))
            stop = threading.Event()

            def embed_on(stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    embed_rate(server.url, args.inputs)

            t = threading.Thread(target=embed_on)
            t.start()
            beside.append(reply_rate(server.url, args.tokens, r))
            stop.set()
            t.join()
            print(f"round {r + 1}: a reply alone {alone[-1]:.1f} tok/s, beside embeddings {beside[-1]:.1f} tok/s")
        a, b = statistics.median(alone), statistics.median(beside)
        print(f"a reply beside embeddings / alone: {b / a:.2f}x ({b:.1f} against {a:.1f} tok/s, {args.tokens} tokens)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
