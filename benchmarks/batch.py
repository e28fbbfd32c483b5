"""Parallel sequences (issue 25, item 2): the engine's N replies in one batch against a bare
llama_decode batch of N sequences, N = 1, 2, 4, 8.

One Engine (the default model, --threads, its measured flash attention setting) and, on the same
llama.cpp context, the bare loop: the prompt evaluated once, its cells shared with N sequences
(llama_memory_seq_cp), then --tokens passes of one token per sequence in one llama_batch with
logits for each, and nothing else (no sampling: the tokens are fixed). The engine's reply asks
for n=N (ignore_eos, --tokens tokens each, temperature 0.7, top-k 40, seed fixed): it samples
each sequence from its own row, records every step, and probes the single-sequence pass (4
extra passes in 128). Per N: aggregate tokens/s of each (bare: N x passes / the passes' wall
time; engine: batch.batch_figures, the steps after each reply's first over the time from the
batch's first step to its last), the ratio engine / bare, and the engine's rate against its own
N=1 (a reply alone). Rounds alternate which goes first. Conditions: `quiet` (whatever else the
machine runs: the load average is printed) and `busy` (beside one CPU-bound process,
tests/cpu_burners.py).

    .venv/bin/python benchmarks/batch.py [--loads quiet,busy] [--rounds 2] [--tokens 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from cpu_burners import cpu_burners  # noqa: E402

from loopchat.batch import batch_figures  # noqa: E402
from loopchat.engine._batch_ffi import BatchCalls  # noqa: E402
from loopchat.engine.engine import Engine  # noqa: E402
from loopchat.events import Finish, Message, Start, Step  # noqa: E402
from loopchat.model_files import builtin_model_path  # noqa: E402
from loopchat.settings import SamplingSettings  # noqa: E402

MESSAGES = (Message("user", "Write a long story about a lighthouse keeper and the sea."),)
SIZES = (1, 2, 4, 8)


def bare(engine: Engine, prompt: list[int], n: int, tokens: int) -> float:
    """Tokens a second of a bare batch: N sequences sharing the prompt, one token each a pass."""
    engine.reset()
    engine.evaluate(prompt)
    engine.sync()
    calls = BatchCalls(engine.llm, engine.n_vocab)
    try:
        p = len(prompt)
        for seq in range(1, n):
            calls.copy(0, seq, p)
        t0 = time.perf_counter()
        for k in range(tokens - 1):  # (as the engine: its first tokens come from the prefill)
            rc = calls.decode([(seq, 300 + (k * 7 + seq) % 500, p + k) for seq in range(n)])
            assert rc == 0, rc
        elapsed = time.perf_counter() - t0
        for seq in range(n):
            calls.remove(seq, p if seq == 0 else 0)
    finally:
        calls.close()
    return n * (tokens - 1) / elapsed


def bare_prefill(engine: Engine, head: list[int], tails: list[list[int]]) -> float:
    """Milliseconds of one bare llama_decode of the prompts of clients arriving together, as cheap as
    one pass can make them: every client's tokens after `head` (evaluated first: the cache's), each
    token computed once for all the clients whose prompts share it up to there (a llama_batch entry
    of several sequence ids, as a shared prefix needs), the logits kept at each prompt's last token,
    nothing else (no sampling, no server). The last of those clients cannot have its first token
    sooner on this machine, whoever serves it: whatever the order, every one of these tokens is
    computed before the last client's first draw."""
    engine.reset()
    engine.evaluate(head)
    engine.sync()
    calls = BatchCalls(engine.llm, engine.n_vocab)
    p, n = len(head), len(tails)
    for seq in range(1, n):
        calls.copy(0, seq, p)
    # (the union of the prompts' tokens: a token at position p + j for every client whose tail has
    # the same first j + 1 tokens)
    entries: dict[tuple[int, ...], list[int]] = {}
    for seq, t in enumerate(tails):
        for j in range(len(t)):
            entries.setdefault(tuple(t[: j + 1]), []).append(seq)
    ends = {tuple(t) for t in tails}
    raw = llama_cpp.llama_batch_init(len(entries), 0, n)
    try:
        for i, (prefix, seqs) in enumerate(entries.items()):
            raw.token[i], raw.pos[i], raw.logits[i] = prefix[-1], p + len(prefix) - 1, prefix in ends
            raw.n_seq_id[i] = len(seqs)
            for k, seq in enumerate(seqs):
                raw.seq_id[i][k] = seq
        raw.n_tokens = len(entries)
        t0 = time.perf_counter()
        rc = llama_cpp.llama_decode(engine.llm.ctx, raw)
        llama_cpp.llama_synchronize(engine.llm.ctx)
        elapsed = time.perf_counter() - t0
        assert rc == 0, rc
        for seq in range(n):
            calls.remove(seq, p if seq == 0 else 0)
    finally:
        llama_cpp.llama_batch_free(raw)
        calls.close()
    return elapsed * 1000.0


def engine_rate(engine: Engine, n: int, tokens: int) -> tuple[float, list[int]]:
    """The engine's N replies: tokens a second together, and the prompt's tokens."""
    engine.reset()
    settings = SamplingSettings(temperature=0.7, top_k=40, seed=3, max_tokens=tokens)
    events = list(engine.generate(MESSAGES, settings, n=n, ignore_eos=True))
    steps = [e for e in events if isinstance(e, Step)]
    start = next(e for e in events if isinstance(e, Start))
    if n == 1:
        fin = next(e for e in events if isinstance(e, Finish))
        return fin.tokens_per_s or 0.0, list(start.prompt_token_ids or ())
    return batch_figures(steps).tokens_per_s, list(start.prompt_token_ids or ())


def measure(engine: Engine, rounds: int, tokens: int) -> dict[int, tuple[float, float]]:
    """Per N: (the engine's median tok/s, the bare batch's median tok/s) over `rounds`."""
    _, prompt = engine_rate(engine, 1, 4)  # (the prompt's tokens; a warm-up)
    out = {}
    for n in SIZES:
        eng, raw = [], []
        for r in range(rounds):
            if r % 2 == 0:
                eng.append(engine_rate(engine, n, tokens)[0])
                raw.append(bare(engine, prompt, n, tokens))
            else:
                raw.append(bare(engine, prompt, n, tokens))
                eng.append(engine_rate(engine, n, tokens)[0])
        out[n] = (statistics.median(eng), statistics.median(raw))
    return out


def report(load: str, results: dict[int, tuple[float, float]]) -> None:
    one = results[1][0]
    print(f"\n{load} (load average {os.getloadavg()[0]:.2f})")
    print(f"{'N':>3} {'bare tok/s':>11} {'engine tok/s':>13} {'engine/bare':>12} {'engine/one':>11}")
    for n, (eng, raw) in results.items():
        print(f"{n:>3} {raw:>11.1f} {eng:>13.1f} {eng / raw:>11.2f}x {eng / one:>10.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", default="quiet,busy")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine = Engine(builtin_model_path(), n_ctx=2048, threads=args.threads)
    print(f"default model, {args.threads} threads, flash attention {engine.flash_attn}, {args.tokens} tokens a reply")
    try:
        for load in args.loads.split(","):
            if load == "busy":
                with cpu_burners(1, seconds=1800):
                    report(load, measure(engine, args.rounds, args.tokens))
            else:
                report(load, measure(engine, args.rounds, args.tokens))
    finally:
        engine.close()


if __name__ == "__main__":
    main()
