"""Continuous batching in `loopchat serve --parallel 8` (issue 25, item 2): N concurrent streaming
clients, N = 1, 2, 4, 8, against the bare llama_decode batch of N (benchmarks/batch.py's `bare`),
and an RSS soak.

One server (a child process: the default model, --threads) and, in this process, an Engine on
the same model and threads for the bare batch (measured while the server idles). Per N and round:
N clients start together (a barrier), each streaming --tokens tokens (ignore_eos, temperature 0)
of its own prompt (the same system prompt, a user message of its own: a joining request's prefill
reuses the shared head from sequence 0's cells). Figures, medians over --rounds:

  aggregate tok/s   every client's tokens after its first, over the span from the first client's
                    first token to the last client's last token
  vs bare           that rate over the bare batch's (N sequences, one token each a pass)
  all running       the rate while all N run, the bare batch's own measure: the tokens that came
                    after the last client's first token, over the span from it to the last token.
                    The aggregate span holds what the bare batch's timer leaves out: the first
                    client's first token comes before the others' joint prefill (sequence 0 is
                    prefilled alone at once), so their prefill (N - 1 user messages' tokens)
                    falls inside it (docs/performance.md, "ninth session")
  vs one            that rate over N=1's (one client alone)
  TTFT              each client's time from its request to its first token chunk (every request
                    evaluates its own user message, the call's number first: N = 1's too, not a
                    prompt the cache holds but its last token); the worst is
                    checked against the issue's bound, "within 2x of an idle server's TTFT plus
                    the pass it waited for": 2 x (an idle server's TTFT, N=1's) + one bare pass
                    of N (the pass in flight a joining request waits for); the looser
                    2 x (idle TTFT + one bare pass of N) that earlier tables used is printed beside
  floor             the least the last of N clients arriving together can wait here, whoever serves
                    them: one bare llama_decode (in this process, the server idle) of their prompts'
                    tokens after what the cache holds, each token shared by several prompts computed
                    once (batch.bare_prefill): every one of them comes before the last client's first
                    draw. Where it is above the bound, no server meets the bound on this machine

Each table twice (--extension on,off): with the `loopchat` extension objects in every chunk (the
default reply) and without (`"loopchat": false`: OpenAI's chunks only, as llama-server sends).

--peer: llama.cpp's own llama-server as the peer (built from the pinned source,
benchmarks/build_llama_bench.sh; `-np 8 -kvu`, flash attention as loopchat's engine has it for
the default model: off), sent the same clients right after loopchat's in every round (each server
idle while the other serves): its aggregate, its rate while all run and its worst TTFT beside
loopchat's. When N clients arrive together, the last one's first token waits for every joining
prompt's prefill on any server: the peer's TTFT says what that costs on this machine.

--stagger: then, per N > 1, N clients that join a running batch one by one (client k starts once
client k - 1 has its first token), each one's TTFT against the issue's bound, 2 x the idle TTFT
+ one bare pass of N (the pass in flight it waits for holds at most N sequences).

The soak: --soak requests (4 clients at once, 8 tokens each); the server's RSS after the first
request and after the last (/proc, psutil). The load average is printed: figures on a shared
machine are only comparable with the load beside them.

    .venv/bin/python benchmarks/serve_batch.py [--rounds 2] [--tokens 48] [--threads 2] [--soak 200] [--extension on,off]
        [--peer] [--stagger]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from batch import bare, bare_prefill  # noqa: E402
from serve_overhead import _TOKEN_CHUNK, SYSTEM, Child, loopchat_serve  # noqa: E402
from serve_vs_llama_server import llama_server, llama_server_binary  # noqa: E402

from loopchat.engine.engine import Engine  # noqa: E402
from loopchat.events import Message, Start  # noqa: E402
from loopchat.model_files import builtin_model_path  # noqa: E402
from loopchat.settings import SamplingSettings  # noqa: E402

SIZES = (1, 2, 4, 8)
TOPICS = ("a lighthouse", "a storm", "a fox", "the moon", "a baker", "a train", "a garden", "a clock")


def body(i: int, tokens: int, extension: bool = True, call: int | None = None) -> dict:
    """Client i's request; `call` (together()'s count) heads the user message: no prompt is then
    one the server's cache holds past the system prompt, each evaluates its own message."""
    ask = f"Write a long story about {TOPICS[i % len(TOPICS)]}."
    if call is not None:
        ask = f"Story {call}: w{ask[1:]}"
    return {
        "loopchat": extension,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": ask},
        ],
        "stream": True,
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def stream_times(
    client: httpx.Client, url: str, data: dict, on_first: Callable[[], None] | None = None
) -> tuple[float, list[float]]:
    """(when the request was sent, when each token chunk arrived): a lean client that parses nothing.
    `on_first`: called as the first token's chunk arrives."""
    times: list[float] = []
    sent = time.perf_counter()
    with client.stream("POST", url + "/v1/chat/completions", json=data) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and _TOKEN_CHUNK.search(line):
                times.append(time.perf_counter())
                if len(times) == 2 and on_first is not None:  # (the first such chunk is the role's)
                    on_first()
    return sent, times[1:]


def run_clients(n: int, one: Callable[[int, httpx.Client], None]) -> None:
    """one(i, client i) for N clients, each on a thread of its own; the clients are made before any
    thread starts (~25 ms each) and closed after every thread has ended."""
    clients = [httpx.Client(timeout=300) for _ in range(n)]
    threads = [threading.Thread(target=one, args=(i, clients[i])) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    for c in clients:
        c.close()


_calls = [0]  # together()'s and staggered()'s calls so far


def together(url: str, n: int, tokens: int, extension: bool = True) -> tuple[float, list[float], float]:
    """N clients at once: (aggregate tok/s, each client's TTFT ms, tok/s while all N run: the
    tokens after the last client's first, over the span from it). Each client's prompt shares
    the system prompt with what the server's cache holds and evaluates its own user message
    (~12 tokens, the call's number first): N = 1's, the bound's idle TTFT, as each of N's."""
    _calls[0] += 1
    call = _calls[0]
    results: list[tuple[float, list[float]]] = [(0.0, [])] * n
    barrier = threading.Barrier(n)

    def one(i: int, client: httpx.Client) -> None:
        barrier.wait(60)
        results[i] = stream_times(client, url, body(i, tokens, extension, call))

    run_clients(n, one)
    firsts = [times[0] for _, times in results]
    lasts = [times[-1] for _, times in results]
    count = sum(len(times) - 1 for _, times in results)
    all_in = max(firsts)
    steady = sum(1 for _, times in results for t in times if t > all_in) / (max(lasts) - all_in)
    return count / (max(lasts) - min(firsts)), [(times[0] - sent) * 1000.0 for sent, times in results], steady


def staggered(url: str, n: int, tokens: int, extension: bool = True) -> list[float]:
    """Clients that join a running batch: client k starts once client k - 1 has its first
    token (client 0 alone first). Each client's TTFT ms (its request to its first token chunk)."""
    _calls[0] += 1
    call = _calls[0]
    first = [threading.Event() for _ in range(n)]
    ttft = [float("nan")] * n

    def one(i: int, client: httpx.Client) -> None:
        try:
            if i:
                first[i - 1].wait(600)
            sent, times = stream_times(client, url, body(i, tokens, extension, call), first[i].set)
            if times:
                ttft[i] = (times[0] - sent) * 1000.0
        finally:
            first[i].set()  # (never leaves the next client waiting)

    run_clients(n, one)
    return ttft


def ttft_bound(rows: Rows, n: int) -> float:
    """The issue's first-token bound at N, ms: 2 x an idle server's TTFT (N = 1's) + one bare pass of N."""
    return 2 * rows[1][2] + n * 1000.0 / rows[n][0]


def measure_stagger(server: Child, args: argparse.Namespace, ext: bool, rows: Rows) -> None:
    """--stagger: per N > 1, each joiner's TTFT (the median over the rounds) against the bound,
    2 x the idle TTFT (N = 1's, `rows`) + one bare pass of N: the pass in flight when it joins
    holds at most N sequences (k of them for client k: the bound is loose by a pass of N less
    one of k, a few ms)."""
    idle = rows[1][2]
    print(f"\njoining a running batch (--stagger: client k starts at client k-1's first token), the extension "
          f"{'on' if ext else 'off'}; idle TTFT {idle:.0f} ms, load {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"{'N':>3} {'bound':>8}  each client's TTFT (ms; * above the bound)")
    for n in SIZES[1:]:
        got = [staggered(server.url, n, args.tokens, ext) for _ in range(args.rounds)]
        med = [statistics.median(r[k] for r in got) for k in range(n)]
        bound = ttft_bound(rows, n)
        cells = " ".join(f"{t:.0f}{'*' if t > bound else ''}" for t in med)
        print(f"{n:>3} {bound:>5.0f} ms  {cells}  (worst joiner {max(med[1:]):.0f} ms)")


def soak(url: str, requests: int, server_rss: Callable[[], int]) -> tuple[int, int]:
    """RSS after the first request and after `requests` (4 clients at once)."""
    with httpx.Client(timeout=300) as c:
        stream_times(c, url, body(0, 8))
    first = server_rss()
    left = list(range(1, requests))
    lock = threading.Lock()

    def worker() -> None:
        with httpx.Client(timeout=300) as c:
            while True:
                with lock:
                    if not left:
                        return
                    i = left.pop()
                stream_times(c, url, body(i, 8))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(1800)
    return first, server_rss()


def prompt_tokens(engine: Engine) -> list[int]:
    messages = (Message("system", SYSTEM), Message("user", f"Write a long story about {TOPICS[0]}."))
    events = engine.generate(messages, SamplingSettings(max_tokens=1))
    start = next(e for e in events if isinstance(e, Start))
    return list(start.prompt_token_ids or ())


def prefill_floor(engine: Engine, n: int, call: int) -> float:
    """batch.bare_prefill of the prompts of N clients arriving together at together()'s call `call`:
    their tokens after what the server's cache holds from the call before (the system prompt's
    head), each shared token once: the least time the last of them can wait for its first token
    here, in ms, before any server's own work."""

    def tokens(i: int, c: int) -> list[int]:
        m = body(i, 1, call=c)["messages"]
        return list(engine.fit_prompt([Message(x["role"], x["content"]) for x in m], 1).tokens)

    before, now = tokens(0, call - 1), [tokens(i, call) for i in range(n)]
    head = 0
    while head < min(len(before), len(now[0])) - 1 and before[head] == now[0][head]:
        head += 1
    return bare_prefill(engine, now[0][:head], [t[head:] for t in now])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--soak", type=int, default=200)
    ap.add_argument("--extension", default="on,off", help="the loopchat extension in the replies: on, off or both")
    ap.add_argument("--peer", action="store_true", help="llama-server -np 8 beside loopchat, the same clients")
    ap.add_argument("--stagger", action="store_true", help="also: clients that join a running batch, their TTFT")
    args = ap.parse_args()
    server = loopchat_serve(args.threads, "--parallel", "8")
    peer: Child | None = None
    # (the served model's context, models.toml's default: 8 clients of 256 tokens need more than 2048)
    engine = Engine(builtin_model_path(), n_ctx=4096, threads=args.threads)
    try:
        if args.peer:
            peer = llama_server(llama_server_binary(), builtin_model_path(), args.threads, "off", parallel=8)
            together(peer.url, 1, 4)  # (a warm-up)
        prompt = prompt_tokens(engine)
        together(server.url, 1, 4)  # (a warm-up)
        for extension in args.extension.split(","):
            rows, peer_rows = measure(server, peer, engine, prompt, args, extension == "on")
            report(rows, args, extension)
            if peer is not None:
                report_peer(rows, peer_rows, extension)
            if args.stagger:
                measure_stagger(server, args, extension == "on", rows)
        if args.soak:
            first, last = soak(server.url, args.soak, server.rss)
            print(f"\nsoak of {args.soak} requests: RSS {first / 2**20:.1f} MiB after the first, "
                  f"{last / 2**20:.1f} MiB after the last ({(last / first - 1) * 100:+.1f}%)")  # fmt: skip
    finally:
        engine.close()
        server.stop()
        if peer is not None:
            peer.stop()


Rows = dict[int, tuple[float, ...]]


def measure(
    server: Child, peer: Child | None, engine: Engine, prompt: list[int], args: argparse.Namespace, ext: bool
) -> tuple[Rows, Rows]:
    """Per N, the medians over the rounds: loopchat's (bare tok/s, aggregate, worst TTFT, all
    running) and the peer's (aggregate, worst TTFT, all running), the peer right after loopchat."""
    rows: Rows = {}
    peer_rows: Rows = {}
    for n in SIZES:
        got: dict[str, list[float]] = {
            k: [] for k in ("bare", "floor", "rate", "ttft", "steady", "p_rate", "p_ttft", "p_steady")
        }
        for _ in range(args.rounds):
            got["bare"].append(bare(engine, prompt, n, args.tokens))
            got["floor"].append(prefill_floor(engine, n, _calls[0] + 1))
            for pre, url in (("", server.url), ("p_", peer.url if peer else None)):
                if url is None:
                    continue
                rate, ttft, steady = together(url, n, args.tokens, ext)
                got[pre + "rate"].append(rate)
                got[pre + "ttft"].append(max(ttft))
                got[pre + "steady"].append(steady)
        med = {k: statistics.median(v) if v else 0.0 for k, v in got.items()}
        rows[n] = (med["bare"], med["rate"], med["ttft"], med["steady"], med["floor"])
        peer_rows[n] = (med["p_rate"], med["p_ttft"], med["p_steady"])
    return rows, peer_rows


def report_peer(rows: Rows, peer_rows: Rows, extension: str) -> None:
    print(f"\nllama-server -np 8 -fa off, the same clients (loopchat's extension {extension}; the peer ignores it)")
    print(
        f"{'N':>3} {'peer tok/s':>11} {'loopchat/peer':>14} {'all running':>12} {'loopchat/peer':>14} {'peer worst TTFT':>16} {'loopchat':>9}"
    )
    for n, (p_rate, p_ttft, p_steady) in peer_rows.items():
        _, rate, ttft, steady, _floor = rows[n]
        print(
            f"{n:>3} {p_rate:>11.1f} {rate / p_rate:>13.2f}x {p_steady:>12.1f} {steady / p_steady:>13.2f}x"
            f" {p_ttft:>13.0f} ms {ttft:>6.0f} ms"
        )


def report(rows: Rows, args: argparse.Namespace, extension: str) -> None:
    one = rows[1][1]
    idle_ttft = rows[1][2]
    load = os.getloadavg()[0]
    print(
        f"\nthe extension {extension}: default model, {args.threads} threads, {args.tokens} tokens a client, load {load:.2f}"
    )
    print(
        f"{'N':>3} {'bare tok/s':>11} {'served tok/s':>13} {'vs bare':>8} {'vs one':>7} {'all running':>12} {'vs bare':>8}"
        f" {'worst TTFT':>11} {'bound':>9} {'2x(idle+pass)':>14} {'floor':>9}"
    )
    for n, (raw, rate, ttft, steady, floor) in rows.items():
        bound, loose = ttft_bound(rows, n), 2 * (idle_ttft + n * 1000.0 / raw)
        print(
            f"{n:>3} {raw:>11.1f} {rate:>13.1f} {rate / raw:>7.2f}x {rate / one:>6.2f}x {steady:>12.1f} {steady / raw:>7.2f}x"
            f" {ttft:>8.0f} ms {bound:>6.0f} ms {loose:>11.0f} ms {floor:>6.0f} ms"
        )


if __name__ == "__main__":
    main()
