"""The sampling chain's wall time on one thread and with the kernel's helper thread (issue 24:
the long float64 exp passes split over the engine's threads, sampler_fused.use_threads).

Replays rows recorded by constraint_cpu.py (`--rows FILE.npz`, the same format; recorded there
if absent) through `sampler.sample` at each of the given combinations, under the JSON schema
(`--without`: no constraint), alternately with `use_threads(1)` and `use_threads(2)` in the same
process, `--rounds` times; prints the median wall ms of each (thread CPU time would hide what a
second thread saves) and how many parts the helper did. Both settings give the same tokens and
the same figures, bit for bit (checked here on every row).

    .venv/bin/python benchmarks/split_wall.py [--model gemma] --rows /tmp/rows.npz [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import constraint_cpu as cc  # noqa: E402

from loopchat.constraint import read_constraint  # noqa: E402
from loopchat.engine import sampler, sampler_fused  # noqa: E402
from loopchat.engine.engine import Engine  # noqa: E402

COMBOS = [(0, 0.95, 0.0, 2.0, 40, 0.8), (0, 1.0, 0.0, 2.0, 40, 0.8), (40, 1.0, 0.0, 2.0, 40, 0.8)]


def replay(
    engine: Engine, constraint, replies: list, combo: tuple, without: bool, gap_ms: float = 0.0
) -> tuple[list[float], list]:
    """Wall ms of sample() (and the matcher's consume) at each recorded row, after `gap_ms` of the
    caller's busy work (a forward pass's stand-in: the helper thread falls asleep); the figures drawn."""
    s, report = cc.settings_of(combo), combo[4]
    times, figures = [], []
    for rows, prompt, tokens in replies:
        stage, rng, context = engine.open_constraint(constraint), sampler.make_rng(1), list(prompt)
        for row, token in zip(rows, tokens):
            busy_until = time.perf_counter() + gap_ms / 1e3
            while time.perf_counter() < busy_until:
                pass
            t0 = time.perf_counter()
            res = sampler.sample(row, context, s, rng, report, constraint=None if without else stage)
            stage.consume(token)
            times.append((time.perf_counter() - t0) * 1e3)
            figures.append((res.token_id, res.kept, res.sampled_entropy, res.sampled_prob, res.stages))
            context.append(token)
    return times, figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a GGUF file, or `gemma` (default: the bundled model)")
    ap.add_argument("--rows", type=Path, required=True, help="constraint_cpu.py's recorded rows (.npz)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--without", action="store_true", help="the chain without the constraint (the same rows)")
    ap.add_argument("--gap-ms", type=float, default=0.0, help="the caller's busy ms before each row (default 0)")
    ap.add_argument("--wake", action="store_true", help="also two threads without the chain's wake (chain_starts)")
    args = ap.parse_args()
    engine = Engine(cc.model_path(args.model), n_ctx=2048, threads=2, log_path=Path("/dev/null"))
    constraint = read_constraint("json_schema", cc.HERE / "story_schema.json")
    if args.rows.exists():
        replies = cc.load(args.rows)
    else:
        replies = cc.record(engine, constraint, 32)
        cc.save(args.rows, replies)
    kernel = sampler_fused.kernel
    assert kernel is not None, "the C kernel is not built"
    starts = sampler_fused.chain_starts
    modes = [1, 2, 0] if args.wake else [1, 2]  # (0: two threads, the helper not woken at the chain's start)
    for combo in COMBOS:
        ms: dict[int, list[float]] = {m: [] for m in modes}
        parts = stalls = 0
        for _ in range(args.rounds):
            seen = {}
            for mode in modes:
                sampler_fused.use_threads(mode or 2)
                sampler_fused.chain_starts = starts if mode else lambda: None  # type: ignore[assignment]
                before, before_stalls = kernel.split_stats()[1:3]
                times, figures = replay(engine, constraint, replies, combo, args.without, args.gap_ms)
                parts += kernel.split_stats()[1] - before
                stalls += kernel.split_stats()[2] - before_stalls
                ms[mode].append(statistics.median(times))
                seen[mode] = figures
            sampler_fused.chain_starts = starts  # type: ignore[assignment]
            assert all(seen[m] == seen[1] for m in modes), "the helper thread changed a figure"
        one, two = statistics.median(ms[1]), statistics.median(ms[2])
        woke = f", two not woken {statistics.median(ms[0]):.3f}" if args.wake else ""
        print(
            f"{combo}: one thread {one:.3f} ms, two {two:.3f} ms ({two / one:.2f}x){woke}, helper parts {parts}, "
            f"stalls {stalls}"
        )
    sampler_fused.use_threads(1)
    print("load average", " ".join(f"{x:.1f}" for x in os.getloadavg()))
    engine.close()


if __name__ == "__main__":
    main()
