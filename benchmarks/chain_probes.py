"""Where a step of the sampling chain goes, as the engine runs it (issue 24): perf_counter_ns probes
around each stage, the sampler's helpers and every call of the C kernel, each row the logits of a
forward pass just run (the replies' recorded tokens fed back, so two trees time the same rows).

Rows: constraint_cpu.py's (`--rows FILE.npz`, recorded there if absent). For each combination
(`--combo top_k,top_p,min_p,t,report,dry`, repeatable; default the top-k off, top-p 0.95 rows),
prints the median wall ms (`--cpu`: the calling thread's CPU ms) of sample() (and the matcher's consume) and, per probe, its mean wall
ms a step (a probe inside another counts in both; the kernel's calls are `k.NAME`).

    .venv/bin/python benchmarks/chain_probes.py [--model gemma] --rows /tmp/rows.npz [--src OTHER/src]
"""

from __future__ import annotations

import argparse
import collections
import importlib
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a GGUF file, or `gemma` (default: the bundled model)")
    ap.add_argument("--rows", type=Path, required=True)
    ap.add_argument("--src", type=Path, default=HERE.parent / "src", help="the loopchat sources to time")
    ap.add_argument("--combo", action="append", help="top_k,top_p,min_p,t,report,dry")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="sampler_fused.use_threads (the pass's threads)")
    ap.add_argument("--no-probes", action="store_true", help="the wall time alone")
    ap.add_argument("--without", action="store_true", help="the chain without the constraint")
    ap.add_argument(
        "--cpu", action="store_true", help="the caller thread's CPU ms, not wall ms (the helper's not counted)"
    )
    return ap.parse_args()


ARGS = _args()
sys.path.insert(0, str(ARGS.src))
sys.path.insert(0, str(HERE))

# (loopchat imported before constraint_cpu, which puts this tree's src first: --src may name another)
importlib.import_module("loopchat.engine.engine")
cc = importlib.import_module("constraint_cpu")

from loopchat.constraint import read_constraint  # noqa: E402
from loopchat.engine import sampler, sampler_fused  # noqa: E402
from loopchat.engine.engine import Engine  # noqa: E402

TIMES: dict[str, int] = collections.defaultdict(int)


def _wrap(name: str, fn):  # noqa: ANN001, ANN202
    def probe(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        t0 = time.perf_counter_ns()
        try:
            return fn(*a, **kw)
        finally:
            TIMES[name] += time.perf_counter_ns() - t0

    return probe


class _KernelProbe:
    def __init__(self, k) -> None:  # noqa: ANN001
        self._k = k

    def __getattr__(self, name: str):  # noqa: ANN204
        v = getattr(self._k, name)
        return _wrap("k." + name, v) if callable(v) else v


def install() -> None:
    """Probes on the kernel, the stages' apply and sample()'s helpers (every module that names them)."""
    from loopchat.engine import sampler_constraint, sampler_stages

    sampler_fused.kernel = _KernelProbe(sampler_fused.kernel)  # type: ignore[assignment]
    for cls in (
        *(getattr(sampler_stages, n) for n in ("RepeatPenalty", "Dry", "TopK", "TopP", "MinP", "Temperature")),
    ):
        cls.apply = _wrap(cls.__name__, cls.apply)
    sampler_constraint.ConstraintStage.apply = _wrap("Constraint", sampler_constraint.ConstraintStage.apply)
    sampler_constraint.ConstraintStage.consume = _wrap("consume", sampler_constraint.ConstraintStage.consume)
    sampler.sample = _wrap("sample", sampler.sample)
    names = [
        "raw_softmax", "top_indices", "unsorted_distribution", "_draw", "rank_of", "_sampled_rank",
        "top_p_positions", "top_p_bins", "take", "cut_after", "top_by_logits", "step_penalties",
        "change_logits", "exp_sum_above", "exp_sum", "top_p_cut", "sample_top", "_top_p_deep", "count_greater",
        "distribution_sums", "weights_of", "top_p_unsorted", "top_p_of_vocabulary", "draw_sorted", "starts_at",
        "chain_starts", "chain_ends", "with_constraint", "_wide_top", "_chain_and_draw", "sorted_distribution",
        "_top_p_stored", "top_p_bounded", "_sample", "top_p_deep", "_top_p_fused", "_cut_inside",
    ]  # fmt: skip
    mods = [
        "sampler", "sampler_distribution", "sampler_math", "sampler_topp", "sampler_cuts", "sampler_stages", "sampler_candidates",
        "sampler_penalized", "dry", "sampler_fused", "sampler_tail", "sampler_constraint", "sampler_raw",
    ]  # fmt: skip
    wrapped: dict[int, object] = {}
    probes = set()
    for m in mods:
        mod = importlib.import_module("loopchat.engine." + m)
        for n in names:
            f = getattr(mod, n, None)
            if callable(f) and not isinstance(f, type) and id(f) not in probes:  # (a probe: wrapped once)
                if id(f) not in wrapped:
                    wrapped[id(f)] = _wrap(n, f)
                    probes.add(id(wrapped[id(f)]))
                setattr(mod, n, wrapped[id(f)])


def _wall_ms() -> float:
    return time.perf_counter_ns() / 1e6


def run(engine: Engine, constraint, replies: list, combo: tuple) -> tuple[list[float], int]:  # noqa: ANN001
    """Each step's wall ms of sample() and consume, each row fresh from a forward pass
    (constraint_cpu's time_after_pass, timed by the wall clock), and the number of steps."""
    clock = cc._thread_ms if ARGS.cpu else _wall_ms
    ms, _passes = cc.time_after_pass(engine, constraint, replies, combo, clock=clock, without=ARGS.without)
    return ms, len(ms)


def main() -> None:
    import os

    engine = Engine(cc.model_path(ARGS.model), n_ctx=2048, threads=2, log_path=Path("/dev/null"))
    constraint = read_constraint("json_schema", HERE / "story_schema.json")
    if ARGS.rows.exists():
        replies = cc.load(ARGS.rows)
    else:
        replies = cc.record(engine, constraint, 32)
        cc.save(ARGS.rows, replies)
    sampler_fused.use_threads(ARGS.threads)
    if not ARGS.no_probes:
        install()
    combos = [tuple(float(v) if "." in v else int(v) for v in c.split(",")) for c in ARGS.combo or []]
    combos = combos or [(0, 0.95, 0.0, 2.0, 40, 0.8), (0, 0.95, 0.0, 0.7, 10, 0.0)]
    print(f"sources {Path(sampler.__file__).parents[2]}, model {ARGS.model or 'default'}, threads {ARGS.threads}")
    for combo in combos:
        TIMES.clear()
        meds, steps = [], 0
        for _ in range(ARGS.rounds):
            ms, n = run(engine, constraint, replies, combo)
            meds.append(statistics.median(ms))
            steps += n
        print(f"{combo}: sample+consume median {'CPU' if ARGS.cpu else 'wall'} ms {' '.join(f'{m:.3f}' for m in meds)}")
        for name, ns in sorted(TIMES.items(), key=lambda kv: -kv[1]):
            print(f"    {name:28s} {ns / steps / 1e6:.4f} ms a step")
    print("load average", " ".join(f"{x:.1f}" for x in os.getloadavg()))
    engine.close()


if __name__ == "__main__":
    main()
