"""Prompt logprobs (issue 26, part 2): what scoring every prompt token costs the prefill.

Each round runs, in alternating order, the prefill of the same prompt (a system prompt and
a user message of --words words; the KV cache reset before each, so the whole prompt is
evaluated) two ways, one token drawn after it:
(a) plain: llama.cpp keeps the last position's logits (n_batch 512 batches);
(b) scored: `prompt_logprobs=1`, every position's logits kept, in chunks of at most
    CHUNK_FLOATS logits (prompt_scores.py), each token's logprob and top guess computed.
The figure is Prefill.ms, the engine's own clock around the prefill (scoring included).
Target: (b) / (a) <= 1.5, the medians over the rounds.

    .venv/bin/python benchmarks/prompt_logprobs.py [--rounds 7] [--words 300] [--model PATH] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from loopchat.engine.engine import Engine  # noqa: E402
from loopchat.events import Message, Prefill  # noqa: E402
from loopchat.model_files import builtin_model_path  # noqa: E402
from loopchat.settings import SamplingSettings  # noqa: E402


def prefill(engine: Engine, messages: tuple[Message, ...], scored: bool) -> Prefill:
    engine.reset()
    events = engine.generate(messages, SamplingSettings(seed=1, max_tokens=1), prompt_logprobs=1 if scored else None)
    return next(e for e in events if isinstance(e, Prefill))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--words", type=int, default=300)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine = Engine(args.model or builtin_model_path(), n_ctx=4096, threads=args.threads)
    text = " ".join(("the quick brown fox jumps over the lazy dog " * (args.words // 9 + 1)).split()[: args.words])
    messages = (Message("system", "You are a helpful assistant."), Message("user", text))
    times: dict[bool, list[float]] = {False: [], True: []}
    tokens = 0
    for r in range(args.rounds):
        for scored in (False, True) if r % 2 == 0 else (True, False):
            p = prefill(engine, messages, scored)
            times[scored].append(p.ms)
            tokens = p.evaluated_tokens
    plain, scored_ms = statistics.median(times[False]), statistics.median(times[True])
    print(f"model {engine.name}, vocabulary {engine.n_vocab}, {tokens} prompt tokens, {args.threads} threads")
    print(f"plain  prefill: median {plain:.1f} ms  ({', '.join(f'{t:.0f}' for t in times[False])})")
    print(f"scored prefill: median {scored_ms:.1f} ms  ({', '.join(f'{t:.0f}' for t in times[True])})")
    print(f"scored / plain: {scored_ms / plain:.2f}")
    engine.close()


if __name__ == "__main__":
    main()
