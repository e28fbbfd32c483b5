"""The sampling chain under a constraint, in CPU time, on logits recorded from the model
(issue 24: the sweep with a JSON schema on): a figure a loaded machine does not move much.

Records `--steps` passes of two replies under the schema (`--json-schema`, default
benchmarks/story_schema.json), drawn at the sweep's worst combination (top-k off, top-p 1,
temperature 2, DRY 0.8: seeds 1 and 2), with their logits, contexts and tokens, into
`--rows FILE.npz` (reused when it exists: two trees then time the very same rows). Then, for
every combination of the sweep's settings, each reply is replayed through a fresh matcher:
`sampler.sample(..., constraint=stage)` on each recorded row, then the matcher consumes the
recorded token (both in the thread CPU time: the matcher may compute the next mask there). Prints the median per combination, the worst first, and
the constraint stage's own parts (the mask, `apply`, `consume`) at the worst combination.

    .venv/bin/python benchmarks/constraint_cpu.py [--model gemma] [--rows /tmp/rows.npz] [--src OTHER/src]

`--after-pass`: each row is the logits of a forward pass run just before (the recorded tokens
fed back), so the chain's arrays are out of the caches as in the engine (its CPU time still).
`--src`: the loopchat sources to time (another tree's `src`, e.g. main's, run with that tree's
venv): the same rows, the other chain. `--rounds N` repeats the timing (best of the rounds'
medians per combination).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", metavar="FILE.gguf", help="a GGUF file, or `gemma` (default: the bundled model)")
    ap.add_argument("--steps", type=int, default=32, help="passes recorded per reply (two replies)")
    ap.add_argument("--json-schema", type=Path, default=HERE / "story_schema.json")
    ap.add_argument("--rows", type=Path, help="the recorded rows (.npz): written if absent, else read")
    ap.add_argument("--src", type=Path, default=HERE.parent / "src", help="the loopchat sources to time")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--only-worst", action="store_true", help="the worst combinations of the grid only")
    ap.add_argument("--after-pass", action="store_true", help="each row fresh from a forward pass (cold caches)")
    ap.add_argument(
        "--without", action="store_true", help="--after-pass: the chain without the constraint (the same rows)"
    )
    return ap.parse_args()


ARGS = _args() if __name__ == "__main__" else None
# (loop_overhead.py is not imported: it puts this tree's src first, and --src may name another)
sys.path.insert(0, str(ARGS.src if ARGS else HERE.parent / "src"))

import numpy as np  # noqa: E402

from loopchat.constraint import read_constraint  # noqa: E402
from loopchat.engine import sampler  # noqa: E402
from loopchat.engine.engine import Engine  # noqa: E402
from loopchat.events import Message  # noqa: E402
from loopchat.model_files import builtin_model_path  # noqa: E402
from loopchat.settings import SamplingSettings  # noqa: E402

#: loop_overhead.py's messages
MESSAGES = [
    Message("system", "You are a helpful assistant."),
    Message("user", "Write a long story about a lighthouse keeper and a storm."),
]

GRID = list(itertools.product((40, 0), (0.95, 1.0), (0.05, 0.0), (0.7, 2.0), (10, 40), (0.0, 0.8)))
#: the combinations the in-engine sweep found worst under the schema (docs/performance.md)
WORST = [(0, 1.0, 0.0, 2.0, 40, 0.8), (0, 1.0, 0.0, 2.0, 10, 0.8), (0, 0.95, 0.0, 2.0, 40, 0.8)]
WORST += [(0, 1.0, 0.0, 0.7, 40, 0.8), (0, 1.0, 0.05, 2.0, 40, 0.8), (40, 1.0, 0.0, 2.0, 40, 0.8)]
RECORD = SamplingSettings(
    seed=1, top_k=0, top_p=1.0, min_p=0.0, temperature=2.0, dry_multiplier=0.8, dry_penalty_last_n=2048
)


def model_path(name: str | None) -> Path:
    """loop_overhead.py's --model: a GGUF file; `gemma`: the tests' Gemma 3 270M; none: the bundled model."""
    if not name:
        return builtin_model_path()
    if name != "gemma":
        return Path(name)
    sys.path.insert(1, str(HERE.parent / "tests"))
    from gemma_model import gemma_path

    return gemma_path()


def settings_of(combo: tuple) -> SamplingSettings:
    top_k, top_p, min_p, temp, _report, dry = combo
    return SamplingSettings(
        top_k=top_k, top_p=top_p, min_p=min_p, temperature=temp, seed=1, dry_multiplier=dry, dry_penalty_last_n=2048
    )


def record(engine: Engine, constraint, steps: int) -> list[tuple[np.ndarray, list[int], list[int]]]:
    """Two replies under the constraint: (their logits rows, the prompt, the tokens drawn)."""
    replies = []
    for seed in (1, 2):
        s = RECORD.replace(seed=seed)
        engine.reset()
        prompt = list(engine.fit_prompt(MESSAGES, steps).tokens)
        engine._eval(prompt)
        stage, rng, context, rows, tokens = (
            engine.open_constraint(constraint),
            sampler.make_rng(seed),
            list(prompt),
            [],
            [],
        )
        for _ in range(steps):
            row = engine._logits().copy()
            token = sampler.sample(row, context, s, rng, 10, constraint=stage).token_id
            rows.append(row)
            tokens.append(token)
            context.append(token)
            if engine.is_eog(token) or not stage.consume(token) or stage.stopped:
                break
            engine._decode_one(token)
            engine._sync()
        replies.append((np.stack(rows), prompt, tokens))
    return replies


def save(path: Path, replies: list) -> None:
    arrays = {}
    for i, (rows, prompt, tokens) in enumerate(replies):
        arrays[f"rows{i}"], arrays[f"prompt{i}"], arrays[f"tokens{i}"] = rows, np.array(prompt), np.array(tokens)
    np.savez(path, **arrays)


def load(path: Path) -> list:
    data = np.load(path)
    n = sum(1 for k in data.files if k.startswith("rows"))
    return [(data[f"rows{i}"], data[f"prompt{i}"].tolist(), data[f"tokens{i}"].tolist()) for i in range(n)]


def time_combo(engine: Engine, constraint, replies: list, combo: tuple) -> list[float]:
    """Thread CPU ms of sample() at each recorded pass, replayed through fresh matchers."""
    s, report = settings_of(combo), combo[4]
    out = []
    for rows, prompt, tokens in replies:
        stage, rng, context = engine.open_constraint(constraint), sampler.make_rng(1), list(prompt)
        for row, token in zip(rows, tokens):
            t0 = time.thread_time()
            sampler.sample(row, context, s, rng, report, constraint=stage)
            stage.consume(token)  # (counted: a tree may compute the next mask there)
            out.append((time.thread_time() - t0) * 1e3)
            context.append(token)
    return out


def _thread_ms() -> float:
    return time.thread_time() * 1e3


def time_after_pass(
    engine: Engine,
    constraint,  # noqa: ANN001
    replies: list,
    combo: tuple,
    clock: Callable[[], float] = _thread_ms,
    without: bool | None = None,
) -> tuple[list[float], list[float]]:
    """As time_combo, each row the logits of a real forward pass run just before (the replies'
    tokens fed back): the chain's ms by `clock` (thread CPU: as the engine sees it), its arrays
    evicted by the pass from the caches; and each pass's thread CPU ms. `without`: no constraint
    (None: --without's)."""
    s, report = settings_of(combo), combo[4]
    if without is None:
        without = bool(ARGS and ARGS.without)
    out, passes = [], []
    for _rows, prompt, tokens in replies:
        engine.reset()
        engine._eval(prompt)
        stage, rng, context = engine.open_constraint(constraint), sampler.make_rng(1), list(prompt)
        for token in tokens:
            logits = engine._logits()
            t0 = clock()
            sampler.sample(logits, context, s, rng, report, constraint=None if without else stage)
            stage.consume(token)  # (counted: a tree may compute the next mask there)
            out.append(clock() - t0)
            context.append(token)
            t0 = time.thread_time()
            engine._decode_one(token)
            engine._sync()
            passes.append((time.thread_time() - t0) * 1e3)
    return out, passes


def parts(engine: Engine, constraint, replies: list, combo: tuple) -> None:
    """The stage's own parts at `combo`: the mask alone, the stage's apply (mask included),
    consume (after the draw: not in sample_ms)."""
    from loopchat.engine.sampler_stages import Candidates, chain_for

    s = settings_of(combo)
    mask, apply, consume = [], [], []
    for rows, prompt, tokens in replies:
        stage, context = engine.open_constraint(constraint), list(prompt)
        for row, token in zip(rows, tokens):
            t0 = time.thread_time()
            stage.allowed_bits()
            mask.append(time.thread_time() - t0)
            raw_max = float(row.max())
            top = sampler.top_indices(row, 10)
            total = float(np.exp(row.astype(np.float64) - raw_max).sum())
            c = Candidates(row, context, raw_max, total, top, 10)
            for st in chain_for(s)[:2]:
                st.apply(c)
            t0 = time.thread_time()
            stage.apply(c)
            apply.append(time.thread_time() - t0)
            t0 = time.thread_time()
            stage.consume(token)
            consume.append(time.thread_time() - t0)
            context.append(token)
    med = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
    print(
        f"the stage at {combo}: mask alone {med(mask):.3f} ms, apply {med(apply):.3f} ms, consume {med(consume):.3f} ms"
    )


def main() -> None:
    assert ARGS is not None
    model = model_path(ARGS.model)
    engine = Engine(model, n_ctx=2048, threads=2, log_path=Path("/dev/null"))
    constraint = read_constraint("json_schema", ARGS.json_schema)
    if ARGS.rows and ARGS.rows.exists():
        replies = load(ARGS.rows)
    else:
        replies = record(engine, constraint, ARGS.steps)
        if ARGS.rows:
            save(ARGS.rows, replies)
    n = sum(len(t) for _, _, t in replies)
    print(f"model {model.name}, sources {Path(sampler.__file__).parents[2]}, {n} rows under {constraint.label()}")
    grid = WORST if ARGS.only_worst else GRID
    best: dict[tuple, float] = {}
    forward: list[float] = []
    for _ in range(ARGS.rounds):
        for combo in grid:
            if ARGS.after_pass:
                times, passes = time_after_pass(engine, constraint, replies, combo)
                forward.extend(passes)
            else:
                times = time_combo(engine, constraint, replies, combo)
            ms = statistics.median(times)
            best[combo] = min(ms, best.get(combo, ms))
    results = sorted(((ms, combo) for combo, ms in best.items()), reverse=True)
    print("chain CPU ms  (top_k, top_p, min_p, temperature, report, dry)")
    for ms, combo in results[:8]:
        print(f"{ms:12.3f}  {combo}")
    for name, pick in (("top-k 40", lambda c: c[0] == 40), ("top-k off", lambda c: c[0] == 0)):
        picked = [ms for ms, c in results if pick(c)]
        if picked:
            print(f"worst, {name}: {max(picked):.3f} ms")
    if forward:
        print(f"the forward pass (thread CPU, the sampling thread's share): median {statistics.median(forward):.2f} ms")
    parts(engine, constraint, replies, results[0][1])
    engine.close()


if __name__ == "__main__":
    main()
