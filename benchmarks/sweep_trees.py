"""The sweep's replies from two source trees, in alternating processes: each tree's in-engine
`sample_ms / forward_ms` as `loop_overhead.py --sweep` measures it (the median over a reply's decode
steps), with the kernel helper's jobs and stalls per reply (`split_stats()`).

Each tree's `src` is copied into a temporary folder and its C kernel built there, both the same way
(the compiler and flags of this Python's build, and setup.py's), so a tree is compared with its own
kernel and neither checkout is touched. Then, per round, one process per tree (the order alternating
by round) loads the model and writes `--replies` replies of `--tokens` tokens, cycling through the
combinations (`--combo top_k,top_p,min_p,t,report,dry`, repeatable; default the sweep's four costliest
under a schema), under `--json-schema` (default benchmarks/story_schema.json; `none`: no constraint),
threads auto (`--threads N` to pin). `--load NAME`: busy_load.py's loads (burners1, compile, mix, ...)
run for the whole comparison. Prints, per tree, the median, mean, worst and 90th percentile of the
replies' ratios, how many are above 0.10, the chain's median ms, the helper's stalls, and the replies
whose chain had (nearly) no helper job (a back-off, or one llama thread: auto's choice).

    .venv/bin/python benchmarks/sweep_trees.py --tree base=/tmp/base --tree new=. [--model gemma] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORST = ["0,1.0,0.0,0.7,40,0.8", "0,0.95,0.0,2.0,40,0.8", "40,0.95,0.05,0.7,10,0.0", "0,0.95,0.05,0.7,10,0.0"]

CHILD = r"""
import json, sys
src, model, schema, tokens, replies, threads = sys.argv[1:7]
combos = [tuple(float(v) if "." in v else int(v) for v in c.split(",")) for c in sys.argv[7:]]
sys.path.insert(0, src)
from pathlib import Path
from loopchat.engine import sampler_fused
assert sampler_fused.kernel is not None and sampler_fused.kernel.__file__.startswith(src), "the tree's kernel"
sys.path.insert(1, BENCH)
import loop_overhead as lo
from loopchat.constraint import read_constraint
from loopchat.engine.engine import Engine
engine = Engine(lo.model_path(model or None), n_ctx=2048, threads=int(threads) or None, log_path=Path("/dev/null"))
cons = None if schema == "none" else read_constraint("json_schema", Path(schema))
k, out = sampler_fused.kernel, []
for i in range(int(replies)):
    combo = combos[i % len(combos)]
    s0 = k.split_stats()
    sample, forward, _ = lo._sweep_reply(engine, combo, int(tokens), cons)
    s1 = k.split_stats()
    out.append([sample, forward, s1[0] - s0[0], s1[2] - s0[2]])
engine.close()
print(json.dumps(out))
"""


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH of a checkout (twice)")
    ap.add_argument("--model", default="gemma", help="a GGUF file, `gemma`, or '' for the bundled model")
    ap.add_argument("--json-schema", default=str(HERE / "story_schema.json"), help="a schema file, or none")
    ap.add_argument("--combo", action="append", help="top_k,top_p,min_p,t,report,dry")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--replies", type=int, default=12, help="replies per process")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="llama threads (0: auto)")
    ap.add_argument("--load", default="quiet", help="busy_load.py's load for the whole run")
    args = ap.parse_args()
    if len(args.tree) != 2 or not all("=" in t for t in args.tree):
        ap.error("give two trees, --tree NAME=PATH each")
    return args


def build(tree: Path, into: Path) -> Path:
    """tree's src copied into `into`, its kernel built there (this Python's compiler and flags, and
    setup.py's): the copy's src."""
    src = into / "src"
    shutil.copytree(tree / "src", src, ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info"))
    c = src / "loopchat" / "engine" / "_sampler_kernel.c"
    so = c.with_name("_sampler_kernel" + sysconfig.get_config_var("EXT_SUFFIX"))
    var = sysconfig.get_config_var
    cmd = [
        *shlex.split(var("CC")),
        *shlex.split(var("CFLAGS") or ""),
        *shlex.split(var("CCSHARED") or ""),
        "-I" + sysconfig.get_paths()["include"],
        *("-O3", "-fno-trapping-math", "-fopenmp-simd", "-shared", str(c), "-o", str(so), "-lpthread", "-lm"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)  # (its warnings: -Wall from CFLAGS)
    if done.returncode != 0:
        raise SystemExit(f"the kernel of {tree} did not build: {done.stderr[-2000:]}")
    return src


def one_process(src: Path, args: argparse.Namespace, combos: list[str]) -> list[list[float]]:
    child = CHILD.replace("BENCH", repr(str(HERE)))
    argv = [sys.executable, "-c", child, str(src), args.model, args.json_schema, str(args.tokens)]
    argv += [str(args.replies), str(args.threads), *combos]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(name: str, rows: list[list[float]]) -> str:
    ratios = sorted(r[0] / r[1] for r in rows)
    return (
        f"{name}: {len(rows)} replies, sample/forward median {statistics.median(ratios):.4f}, mean "
        f"{statistics.mean(ratios):.4f}, p90 {ratios[int(len(ratios) * 0.9)]:.3f}, worst {ratios[-1]:.3f}, above "
        f"0.10: {sum(x > 0.10 for x in ratios)}; chain median {statistics.median(r[0] for r in rows):.2f} ms; "
        f"stalls {int(sum(r[3] for r in rows))}; replies with <= 5 helper jobs {sum(r[2] <= 5 for r in rows)}"
    )


def main() -> None:
    args = _args()
    sys.path.insert(0, str(HERE))
    from busy_load import load

    combos = args.combo or WORST
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree]
    rows: dict[str, list[list[float]]] = {name: [] for name, _ in trees}
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {name: build(path, Path(tmp) / name) for name, path in trees}
        with load(args.load, 4 * 3600):
            for r in range(args.rounds):
                for name, _ in trees if r % 2 == 0 else trees[::-1]:
                    rows[name] += one_process(srcs[name], args, combos)
    print(f"model {args.model or 'default'}, load {args.load}, {args.rounds} rounds, combinations {combos}")
    for name, _ in trees:
        print(report(name, rows[name]))


if __name__ == "__main__":
    main()
