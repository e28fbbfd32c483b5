"""sample() alone, two trees side by side in one process: the calling thread's CPU per step, each
row the logits of a forward pass run just before (the recorded replies' tokens fed back, as
chain_probes.py and constraint_cpu.py `--after-pass` do). `--json-schema FILE`: under that constraint,
each tree with its own stage (its own sampler_constraint module), both stages consuming every recorded
token after the step (not timed); without it, no constraint.

Both trees' sampler modules (and their C kernels) are loaded into this process (the base tree's
first, its `loopchat` modules then set aside under their own objects), and the steps alternate:
at step i of a round the tree (i + round) % 2 samples, so each tree sees every row's cold caches
half the time and both see the same machine load, step by step.

    .venv/bin/python benchmarks/sample_trees.py --base /tmp/base/src --rows /tmp/rows.npz \
        [--combo 40,0.95,0.05,0.7,5,0,1.1 ...] [--rounds 4] [--model gemma]

`--combo top_k,top_p,min_p,t,report,dry[,repeat_penalty]` (repeatable; the repeat penalty 1.1 when
left out: the default). Rows: constraint_cpu.py's recorded replies (`--rows`, made by chain_probes.py
or constraint_cpu.py; the tokens are what is used). Prints, per combination, each tree's median CPU
ms a step over all its steps, their ratio, and the load average. `--check`: each step also runs the
other tree on a copy of the same row and context with its own generator, and every field of the two
results must be equal (a cheap check on these combinations; chain10's check covers the sweep).
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_COMBOS = ["40,0.95,0.05,0.7,5,0,1.1", "40,0.95,0.05,0.7,5,0,1.0", "40,0.95,0.05,0.7,0,0,1.1"]
DEFAULT_COMBOS += ["40,0.95,0.05,0.7,1,0,1.1", "40,0.95,0.05,0.7,20,0,1.1"]


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True, help="the other tree's src")
    ap.add_argument("--src", type=Path, default=HERE.parent / "src")
    ap.add_argument("--rows", type=Path, required=True)
    ap.add_argument("--model", help="a GGUF file, or `gemma` (default: the bundled model)")
    ap.add_argument("--combo", action="append")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2, help="the pass's threads and sampler_fused.use_threads")
    ap.add_argument("--check", action="store_true", help="every field of both trees' results equal, each step")
    ap.add_argument("--json-schema", type=Path, help="the chain under this JSON schema (each tree's own stage)")
    return ap.parse_args()


def _combo(text: str) -> tuple:
    vals = [float(v) if "." in v else int(v) for v in text.split(",")]
    return tuple(vals) if len(vals) == 7 else (*vals, 1.1)


def load_tree(src: Path) -> dict[str, Any]:
    """The tree's sampler, sampler_fused and settings modules (its `loopchat` modules then removed
    from sys.modules, kept alive by the objects returned)."""
    for name in [m for m in sys.modules if m == "loopchat" or m.startswith("loopchat.")]:
        del sys.modules[name]
    sys.path.insert(0, str(src))
    try:
        names = ("engine.sampler", "engine.sampler_fused", "engine.sampler_constraint", "settings", "constraint")
        mods = {n: importlib.import_module("loopchat." + n) for n in names}
    finally:
        sys.path.remove(str(src))
    return mods


def _same(a: Any, b: Any) -> bool:
    import numpy as np

    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, float):
        return isinstance(b, float) and (a == b or (a != a and b != b))
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


FIELDS = ("token_id", "raw_top_ids", "raw_top_probs", "sampled_top_ids", "sampled_top_probs", "raw_prob")
FIELDS += ("raw_rank", "sampled_prob", "sampled_rank", "raw_entropy", "sampled_entropy", "kept", "stages")


def _stages(trees: list, engine: Any, schema: Path | None) -> list:
    """Each tree's constraint stage for a reply (None: no constraint)."""
    if schema is None:
        return [None, None]
    out = []
    for tr in trees:
        spec = tr["constraint"].read_constraint("json_schema", schema)
        out.append(tr["engine.sampler_constraint"].open_stage(engine.llm, spec, engine.n_vocab, engine.piece_text))
    return out


def main() -> None:
    args = _args()
    combos = args.combo or DEFAULT_COMBOS
    trees = [load_tree(args.base.resolve()), load_tree(args.src.resolve())]
    sys.path.insert(0, str(args.src.resolve()))
    sys.path.insert(1, str(HERE))
    import constraint_cpu as cc

    from loopchat.engine.engine import Engine

    engine = Engine(cc.model_path(args.model), n_ctx=2048, threads=args.threads, log_path=Path("/dev/null"))
    for t in trees:
        t["engine.sampler_fused"].use_threads(args.threads)
    replies = cc.load(args.rows)
    got: dict[str, list[list[float]]] = {c: [[], []] for c in combos}
    loads, checked = [], 0
    for r in range(args.rounds):
        for text in combos:
            top_k, top_p, min_p, t, report, dry, repeat = _combo(text)
            kw = dict(top_k=top_k, top_p=top_p, min_p=min_p, temperature=t, seed=1, dry_multiplier=dry)
            kw.update(dry_penalty_last_n=2048, repeat_penalty=repeat)
            settings = [tr["settings"].SamplingSettings(**kw) for tr in trees]
            i = 0
            for _rows, prompt, tokens in replies:
                engine.reset()
                engine._eval(prompt)
                rngs = [tr["engine.sampler"].make_rng(1) for tr in trees]
                stages, checks = _stages(trees, engine, args.json_schema), _stages(trees, engine, args.json_schema)
                context = list(prompt)
                for token in tokens:
                    logits = engine._logits()
                    which = (i + r) % 2
                    sample = trees[which]["engine.sampler"].sample
                    t0 = time.thread_time_ns()
                    sample(logits, context, settings[which], rngs[which], report, constraint=stages[which])
                    got[text][which].append((time.thread_time_ns() - t0) / 1e6)
                    if args.check:  # (fresh generators on both sides: the timed ones move on alone)
                        a, b = (
                            tr["engine.sampler"].sample(
                                logits.copy(),
                                list(context),
                                st,
                                tr["engine.sampler"].make_rng(i),
                                report,
                                constraint=cs,
                            )
                            for tr, st, cs in zip(trees, settings, checks)
                        )
                        bad = [f for f in FIELDS if not _same(getattr(a, f), getattr(b, f))]
                        if checks[0] is not None and tuple(checks[0].report) != tuple(checks[1].report):
                            bad.append("constraint report")
                        if bad:
                            sys.exit(f"{text} step {i}: fields differ: {bad}")
                        checked += 1
                    for st in (*stages, *checks):
                        if st is not None:
                            st.consume(token)
                    i += 1
                    context.append(token)
                    engine._decode_one(token)
                    engine._sync()
        loads.append(os.getloadavg()[0])
    engine.close()
    print(
        f"base {args.base}, this {args.src}, model {args.model or 'default'}, {args.rounds} rounds, steps alternating"
        + (f", under {args.json_schema}" if args.json_schema else "")
    )
    print("combo (top_k,top_p,min_p,t,report,dry,repeat): median CPU ms a step (all steps of each tree)")
    for text in combos:
        b, t = (statistics.median(v) for v in got[text])
        print(f"  {text:28s} base {b:.3f}  this {t:.3f}  ratio {t / b:.3f}  (steps {len(got[text][0])} each)")
    if args.check:
        print(f"checked: {checked} steps, every field equal")
    print("load average (1 min) after each round:", " ".join(f"{x:.1f}" for x in loads))


if __name__ == "__main__":
    main()
