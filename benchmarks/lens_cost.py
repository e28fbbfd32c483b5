"""The logit lens's cost (issue 26, part 1): the decode rate with the lens on against off.

Each round runs, alternating, the same reply (a fixed seed, --tokens tokens, ignore_eos)
with `lens=False` and `lens=True`; the figure is Finish.tokens_per_s (the engine's own
clock, the lens's time included: it runs between the passes). Reported beside it: the
time a pass's lens takes (the difference of the per-token times).

    .venv/bin/python benchmarks/lens_cost.py [--rounds 3] [--tokens 24] [--model PATH] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from loopchat.engine.engine import Engine  # noqa: E402
from loopchat.events import Finish, Message  # noqa: E402
from loopchat.model_files import builtin_model_path  # noqa: E402
from loopchat.settings import SamplingSettings  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine = Engine(args.model or builtin_model_path(), n_ctx=1024, threads=args.threads)
    engine.open_lens()  # the head read once, outside the figures (reported below)
    doc = (Message("document", "Once upon a time, in a small village by the sea, there lived"),)
    settings = SamplingSettings(seed=1, max_tokens=args.tokens)
    rates: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.rounds):
        for lens in (False, True) if r % 2 == 0 else (True, False):
            engine.reset()
            finish = list(engine.generate(doc, settings, lens=lens, ignore_eos=True))[-1]
            assert isinstance(finish, Finish)
            rates[lens].append(finish.tokens_per_s)
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"model {engine.name}, {args.tokens} tokens, {args.threads} threads")
    print(f"lens off: {off:.1f} tok/s ({', '.join(f'{x:.1f}' for x in rates[False])})")
    print(f"lens on:  {on:.1f} tok/s ({', '.join(f'{x:.1f}' for x in rates[True])})")
    print(f"on / off: {on / off:.3f}; the lens of a pass: {1000 / on - 1000 / off:.0f} ms")
    engine.close()


if __name__ == "__main__":
    main()
