"""The sampling chain alone, in CPU time, on logits recorded from the model: a figure a
loaded machine does not move much (`loop_overhead.py --sweep` times the chain inside the
engine, in wall time, against a forward pass that a busy machine slows far more).

Records `--steps` passes of two replies (the defaults at temperature 0.7, and top-k off at
temperature 2: a flatter text; `--text worst`: both replies drawn at the sweep's worst
combination instead, top-k off, top-p 0.95, temperature 2, DRY 0.8: the rows the sweep's
worst steps see), then runs `sampler.sample` on each recorded row for every
combination of the sweep's settings (top-k 40/off, top-p 0.95/1, min-p 0.05/0, temperature
0.7/2, 10/40 candidates reported, DRY off/0.8) and prints the median thread CPU time per
step, the worst first, and the worst of each class (against the forward pass measured while
recording), then the raw softmax's pass alone (sampler_raw: the kernel's fused pass and
numpy's, where the tree has it). `LOOPCHAT_SAMPLER_KERNEL=0` runs the chain's numpy path
instead of its C kernel. `--cold`: before each step the caches are emptied (a 32 MB write, as a
forward pass streams the model's weights through the L3) and the row written again (as llama.cpp
leaves it): the chain as the engine runs it, 1.4-1.6x its time on a warm cache
(docs/performance.md, "The sampling chain's cost, cold").

    .venv/bin/python benchmarks/sampler_cpu.py [--model FILE.gguf | --model gemma] [--steps 32] [--text worst] [--cold]

To compare two versions of the chain, run this file from each tree (it imports the
`src/` beside it).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from loop_overhead import MESSAGES, model_path  # noqa: E402

from loopchat.engine import sampler  # noqa: E402
from loopchat.engine.engine import Engine  # noqa: E402
from loopchat.settings import SamplingSettings  # noqa: E402

GRID = list(itertools.product((40, 0), (0.95, 1.0), (0.05, 0.0), (0.7, 2.0), (10, 40), (0.0, 0.8)))


#: the sweep's worst combination (docs/performance.md): the text `--text worst` records
WORST = SamplingSettings(
    seed=1, top_k=0, top_p=0.95, min_p=0.0, temperature=2.0, dry_multiplier=0.8, dry_penalty_last_n=2048
)


def record(model: Path, steps: int, text: str = "mixed") -> tuple[list, float]:
    """(rows of (logits, context), the median forward pass in ms while recording)."""
    engine = Engine(model, n_ctx=2048, threads=2, log_path=Path("/dev/null"))
    rows, forward = [], []
    replies = (SamplingSettings(seed=1, temperature=0.7), SamplingSettings(seed=1, top_k=0, top_p=1.0, min_p=0.0))
    for s in replies if text == "mixed" else (WORST, WORST.replace(seed=2)):
        if text == "mixed":
            s = s.replace(temperature=0.7 if s.top_k else 2.0)
        engine.reset()
        context = list(engine.fit_prompt(MESSAGES, steps).tokens)
        engine._eval(context)
        rng = sampler.make_rng(s.seed)
        for _ in range(steps):
            row = engine._logits().copy()
            rows.append((row, list(context)))
            token = sampler.sample(row, context, s, rng).token_id
            context.append(token)
            t0 = time.perf_counter()
            engine._decode_one(token)
            engine._sync()
            forward.append((time.perf_counter() - t0) * 1e3)
    engine.close()
    return rows, statistics.median(forward)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", metavar="FILE.gguf", help="a GGUF file, or `gemma` (default: the bundled model)")
    ap.add_argument("--steps", type=int, default=32, help="passes recorded per reply (two replies)")
    ap.add_argument("--text", choices=("mixed", "worst"), default="mixed", help="the replies recorded (above)")
    ap.add_argument("--cold", action="store_true", help="empty the caches before each step (above)")
    args = ap.parse_args()
    model = model_path(args.model)
    rows, forward_ms = record(model, args.steps, args.text)
    path = getattr(getattr(sampler, "sampler_fused", None), "PATH", "numpy")
    print(
        f"model {model.name}, {len(rows)} rows, chain path {path}; forward pass while recording: median {forward_ms:.1f} ms (wall)"
    )
    results = []
    for top_k, top_p, min_p, temp, report, dry in GRID:
        s = SamplingSettings(
            top_k=top_k, top_p=top_p, min_p=min_p, temperature=temp, seed=1, dry_multiplier=dry, dry_penalty_last_n=2048
        )
        rng = sampler.make_rng(1)
        times = []
        for logits, context in rows:
            if args.cold:
                evict(logits)
            t0 = time.thread_time()
            sampler.sample(logits, context, s, rng, report)
            times.append((time.thread_time() - t0) * 1e3)
        results.append((statistics.median(times), (top_k, top_p, min_p, temp, report, dry)))
    results.sort(reverse=True)
    print("chain CPU ms  (top_k, top_p, min_p, temperature, report, dry)")
    for ms, combo in results[:8]:
        print(f"{ms:12.3f}  {combo}")
    for name, pick in (
        ("top-k 40", lambda c: c[0] == 40),
        ("top-k off, DRY off", lambda c: c[0] == 0 and c[5] == 0),
        ("top-k off, DRY on", lambda c: c[0] == 0 and c[5] > 0),
    ):
        worst = max(ms for ms, c in results if pick(c))
        print(f"worst, {name}: {worst:.3f} ms ({worst / forward_ms:.3f} of the forward pass above)")
    raw_pass(rows)


_FLUSH = np.empty(32 << 20, dtype=np.uint8)


def evict(row: np.ndarray) -> None:
    """The caches as a forward pass leaves them: everything out (a write of 32 MB, twice the
    L3), but the row of logits it has just written."""
    _FLUSH.fill(1)
    row *= np.float32(1.0)


def raw_pass(rows: list) -> None:
    """The raw softmax alone (sampler_raw), the median thread CPU time per row: fused, numpy."""
    try:
        from loopchat.engine import sampler_raw
    except ImportError:
        return
    line = []
    for fused in (True, False):
        if fused and not sampler_raw.RAW_FUSED:
            continue
        saved, sampler_raw.RAW_FUSED = sampler_raw.RAW_FUSED, fused
        times = []
        for logits, _ in rows:
            t0 = time.thread_time()
            sampler_raw.raw_softmax(logits, float(logits.max()))
            times.append((time.thread_time() - t0) * 1e3)
        sampler_raw.RAW_FUSED = saved
        line.append(f"{'fused' if fused else 'numpy'} {statistics.median(times):.3f} ms")
    print("raw softmax alone (CPU, median a row): " + ", ".join(line))


if __name__ == "__main__":
    main()
