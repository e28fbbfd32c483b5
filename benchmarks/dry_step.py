"""One DRY step (engine/dry.py's step_penalties) on a context with a breaker and a repeat after it,
warm, through a BreakerTable as the engine reads it: microseconds a step, the best of five rounds.
Run it on two trees (`--src`, another tree's src with its kernel built) to compare them; both
print the penalties they found, which must be the same.

    .venv/bin/python benchmarks/dry_step.py [--src OTHER/src] [--tokens 131]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


class _Vocab:
    """49,152 pieces, every 50th a JSON quote and colon (a breaker)."""

    n_vocab = 49152

    def piece(self, i: int) -> bytes:
        return b'":' if i % 50 == 0 else b" w%d" % i


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, default=HERE.parent / "src", help="the loopchat sources to time")
    ap.add_argument("--tokens", type=int, default=131, help="the context's length (about)")
    ap.add_argument("--steps", type=int, default=2000)
    args = ap.parse_args()
    sys.path.insert(0, str(args.src))
    from loopchat.engine import dry, sampler_fused
    from loopchat.settings import SamplingSettings

    rng = random.Random(1)
    base = [rng.randrange(0, 24576) * 2 + 1 for _ in range(max(args.tokens * 6 // 10, 8))]  # (odd: no breaker)
    # a breaker (100) in the middle, then a repeat of earlier tokens after it
    context = dry.History(base + [100] + base[: max(args.tokens - len(base) - 1, 1)], _Vocab())
    s = SamplingSettings(dry_multiplier=0.8, dry_penalty_last_n=2048)
    found = dry.step_penalties(context, s, 49152)
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(args.steps):
            dry.step_penalties(context, s, 49152)
        rounds.append((time.perf_counter_ns() - t0) / args.steps / 1e3)
    print(f"sources {Path(dry.__file__).parents[2]}, kernel {sampler_fused.PATH}, {len(context)} tokens")
    print(f"DRY step: {min(rounds):.1f} us (best of 5 rounds of {args.steps})")
    print(f"penalized ids {found[0].tolist()}, penalties {found[1].tolist()}")


if __name__ == "__main__":
    main()
