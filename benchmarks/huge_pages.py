"""The model in 2 MB pages against llama.cpp's own mapping of the file (engine/huge_pages.py),
side by side in one process: the same GGUF loaded twice, once with LOOPCHAT_HUGE_PAGES=0 (the
file's 4 KB pages, llama.cpp's default) and once as loopchat loads it, replies alternating
between the two engines, the same prompt, settings and seed (the same tokens).

    .venv/bin/python benchmarks/huge_pages.py [--model gemma] [--tokens 1024] [--rounds 4] [--threads 2]

Per round and engine: decode tokens/s ((tokens - 1) / the time from the first token to the last),
the median forward_ms and sample_ms of the steps (and their ratio: issue 24's figure), then the
medians of the rounds and huge/4KB. --busy N runs N CPU-bound processes beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cpu_burners import cpu_burners  # noqa: E402
from loop_overhead import MESSAGES, model_path  # noqa: E402

from loopchat.engine.engine import Engine  # noqa: E402
from loopchat.events import Step  # noqa: E402
from loopchat.settings import SamplingSettings  # noqa: E402


def load(model: Path, huge: bool, threads: int | None) -> Engine:
    os.environ["LOOPCHAT_HUGE_PAGES"] = "1" if huge else "0"
    t = time.perf_counter()
    engine = Engine(model, n_ctx=4096, threads=threads, log_path=Path("/dev/null"))
    print(
        f"{'2 MB' if huge else '4 KB'} pages: loaded in {time.perf_counter() - t:.2f} s, {engine.llm.huge_pages_mb} MB in 2 MB pages"
    )
    return engine


def reply(engine: Engine, settings: SamplingSettings) -> tuple[float, float, float, list[int]]:
    """(decode tok/s, median forward_ms, median sample_ms, the tokens) of one reply."""
    stamps: list[float] = []
    steps: list[Step] = []
    for e in engine.generate(MESSAGES, settings, ignore_eos=True):
        if isinstance(e, Step):
            stamps.append(time.perf_counter())
            steps.append(e)
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    fwd = statistics.median(s.forward_ms for s in steps[1:])
    smp = statistics.median(s.sample_ms for s in steps[1:])
    return rate, fwd, smp, [s.token_id for s in steps]


def compare(model: Path, threads: int | None, tokens: int, rounds: int) -> None:
    """The two engines' replies, alternating, a line a round and the medians."""
    engines = {False: load(model, False, threads), True: load(model, True, threads)}
    settings = SamplingSettings(seed=1, max_tokens=tokens, temperature=0.7)
    for huge in (False, True):  # warm-up
        reply(engines[huge], settings.replace(max_tokens=32))
    rows: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        texts = {}
        for huge in order:
            rate, fwd, smp, toks = reply(engines[huge], settings)
            rows[huge].append((rate, fwd, smp))
            texts[huge] = toks
        same = "same tokens" if texts[False] == texts[True] else "TOKENS DIFFER"
        a, b = rows[False][-1], rows[True][-1]
        print(
            f"round {r + 1}: 4 KB {a[0]:6.1f} tok/s (forward {a[1]:.2f} ms, sample/forward {a[2] / a[1]:.3f})   "
            f"2 MB {b[0]:6.1f} tok/s (forward {b[1]:.2f} ms, {b[2] / b[1]:.3f})   {b[0] / a[0]:.3f}x  {same}"
        )
    med = {h: [statistics.median(v[i] for v in rows[h]) for i in range(3)] for h in rows}
    ratios = [b[0] / a[0] for a, b in zip(rows[False], rows[True])]
    print(
        f"median: 4 KB {med[False][0]:.1f} tok/s, 2 MB {med[True][0]:.1f} tok/s: {statistics.median(ratios):.3f}x "
        f"(rounds {min(ratios):.3f}-{max(ratios):.3f}); forward {med[False][1]:.2f} / {med[True][1]:.2f} ms; "
        f"sample {med[False][2]:.3f} / {med[True][2]:.3f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF file, or `gemma` (default: the bundled model)")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2, help="0: auto (the thread tuner)")
    ap.add_argument("--busy", type=int, default=0, help="CPU-bound processes beside it")
    args = ap.parse_args()
    with cpu_burners(args.busy, seconds=3600.0):
        compare(model_path(args.model), args.threads or None, args.tokens, args.rounds)


if __name__ == "__main__":
    main()
