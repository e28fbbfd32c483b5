"""The loop's speed and its worst passes on a busy machine: threads 1, 2 and auto, headless
(as `loopchat run` runs the engine) and under `loopchat serve`, beside several loads.

Users run loopchat beside a browser, a build, another model. llama.cpp's threads meet at
an OpenMP barrier at every graph node, so one thread the OS deschedules stalls the
others: on this project's 2-core machine 2 threads are the fastest when it is quiet and
10-50x slower than 1 as soon as other programs run. `threads = "auto"` measures and
chooses (thread_tuner.py), re-checking the other counts now and then; its probes are
cut when they run long (probe_guard.py). This benchmark checks auto against every fixed
count in each condition:

- conditions (busy_load.py, each bounded in time and killed when it ends): `quiet`
  (whatever else the machine runs), `burners1`/`burners2` (pure CPU burners), `compile`
  (two build-like processes that work and sleep in bursts and start short children),
  `mix` (compile plus a second loopchat generating long replies);
- kinds: `run` (a fresh process runs the engine as `loopchat run` does: one reply) and
  `serve` (a real `loopchat serve` on a free port, one streamed request with the
  `loopchat` extension, whose steps carry each pass's time);
- each configuration (kind x threads) a fresh process making one reply of --tokens
  tokens (>= 1,000: long enough to meet several re-checks, every 10 s of passes), cut
  short after --max-s seconds (a reply at 2 threads beside burners would take an hour).

Per configuration: decode tok/s, the p99 and the worst forward pass (ms), the passes
over 250 ms, and (auto) the probe passes cut. Per condition and kind: auto against the
best fixed count (the one with the highest tok/s). Targets (issue 22): auto's tok/s >=
0.9x the best fixed count's in every condition; auto's p99 <= 2x the best's p99; no
pass over 250 ms under auto that the best fixed count did not have too.

    .venv/bin/python benchmarks/busy_machine.py [--loads quiet,burners2,mix] [--kinds run,serve] [--tokens 1000] [--max-s 40]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
# --src DIR: the loopchat to measure (e.g. an older commit's `git archive ... src`), for a before/after
sys.path.insert(0, os.environ.get("BUSY_MACHINE_SRC", str(ROOT / "src")))

THREADS = ("1", "2", "auto")
PROMPT = "Write a very long story about a dragon who learns to cook. Make it at least 1000 words."


def _figures(forward_ms: list[float], tok_s: float, cuts: int, extra: dict | None = None) -> dict:
    ms = forward_ms or [float("nan")]
    return {
        "tok_s": tok_s,
        "passes": len(forward_ms),
        "p99": pct(ms, 0.99),
        "worst": max(ms),
        "over250": sum(1 for m in ms if m > 250),
        "cuts": cuts,
        **(extra or {}),
    }


def child_run(threads: str, tokens: int, max_s: float) -> dict:
    from loopchat.config import load_config
    from loopchat.engine.engine import Engine
    from loopchat.events import Finish, Message, Step
    from loopchat.settings import SamplingSettings

    spec = load_config(None).get(None)
    t = threads if threads == "auto" else int(threads)
    eng = Engine(spec.resolve_file(), n_ctx=4096, threads=t, log_path=Path(os.devnull))
    timer = threading.Timer(max_s, eng.cancel)
    timer.start()
    steps, finish = [], None
    for e in eng.generate(
        [Message("user", PROMPT)], SamplingSettings(seed=1, max_tokens=tokens, temperature=0.7), ignore_eos=True
    ):
        if isinstance(e, Step):
            steps.append(e)
        elif isinstance(e, Finish):
            finish = e
    timer.cancel()
    eng.close()
    return _figures(
        [s.forward_ms for s in steps[1:]], finish.tokens_per_s, sum(1 for s in steps if getattr(s, "probe_cut_ms", 0))
    )


def child_serve(threads: str, tokens: int, max_s: float) -> dict:
    import httpx

    proc = subprocess.Popen(
        [sys.executable, "-m", "loopchat", "serve", "--port", "0", "--threads", threads],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # "loopchat serve: listening on URL · ..."
        url = line.split("listening on ")[1].split(" ")[0]
        model = line.split(" · model ")[1].split(" ")[0]
        body = {
            "model": model,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": tokens,
            "stream": True,
            "ignore_eos": True,
            "seed": 1,
            "temperature": 0.7,
            "loopchat": True,
        }
        forward, cuts, n, t_first, t_last = [], 0, 0, None, None
        end = time.monotonic() + max_s
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=max_s + 60) as r:
            for raw in r.iter_lines():
                if not raw.startswith("data: {"):
                    continue
                step = json.loads(raw[6:]).get("loopchat", {}).get("step")
                if step is None:
                    continue
                now = time.perf_counter()
                if n:
                    forward.append(step["forward_ms"])
                else:
                    t_first = now
                t_last, n = now, n + 1
                cuts += bool(step.get("probe_cut_ms"))
                if time.monotonic() > end:
                    break  # the client leaves: the server cancels the reply
        tok_s = (n - 1) / (t_last - t_first) if n > 1 else 0.0  # as Finish: steps after the first
        return _figures(forward, tok_s, cuts, {"startup": line.strip()})
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def run_child(kind: str, threads: str, tokens: int, max_s: float) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", kind, threads, str(tokens), str(max_s)],
        capture_output=True,
        text=True,
        timeout=max_s + 240,
    )
    if proc.returncode != 0:
        raise SystemExit(f"child {kind} {threads} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _row(name: str, r: dict) -> str:
    return (
        f"  {name:<12}{r['tok_s']:9.1f}{r['p99']:10.1f}{r['worst']:10.1f}{r['over250']:8d}"
        f"{r['cuts']:7d}{r['passes']:8d}"
    )


def report(results: dict, loads: list[str], kinds: list[str]) -> None:
    print(f"\n{'':<14}{'tok/s':>9}{'p99 ms':>10}{'worst ms':>10}{'>250ms':>8}{'cuts':>7}{'passes':>8}")
    verdicts = []
    for load in loads:
        for kind in kinds:
            rs = {t: results.get((load, kind, t)) for t in THREADS}
            if any(v is None for v in rs.values()):
                continue
            print(f"{load} · {kind}")
            for t in THREADS:
                print(_row("threads " + t, rs[t]))
            best_t = max(("1", "2"), key=lambda t: rs[t]["tok_s"])
            best, auto = rs[best_t], rs["auto"]
            ratio = auto["tok_s"] / best["tok_s"] if best["tok_s"] else float("nan")
            p99 = auto["p99"] / best["p99"]
            ok = ratio >= 0.9 and p99 <= 2.0 and auto["over250"] <= best["over250"]
            verdicts.append(ok)
            print(
                f"  auto / best fixed ({best_t}): tok/s {ratio:.2f} (>= 0.9) · p99 {p99:.2f}x (<= 2) · "
                f">250 ms {auto['over250']} vs {best['over250']} · {'ok' if ok else 'MISSED'}"
            )
            if kind == "serve":
                print(f"  auto's start-up line: {auto.get('startup', '')}")
    print(f"\n{sum(verdicts)} of {len(verdicts)} conditions meet every target")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loads", default="quiet,burners2,mix")
    ap.add_argument("--kinds", default="run,serve")
    ap.add_argument("--threads", default=",".join(THREADS))
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--max-s", type=float, default=40.0, help="a reply's time limit (it is cut there)")
    ap.add_argument("--src", help="the loopchat source folder to measure (default: this checkout's src)")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.src:  # the children (this script and `python -m loopchat serve`) import it first
        src = str(Path(args.src).resolve())
        os.environ["BUSY_MACHINE_SRC"] = src
        os.environ["PYTHONPATH"] = src + os.pathsep + os.environ.get("PYTHONPATH", "")
    if args.child:
        kind, threads, tokens, max_s = args.child
        fn = child_run if kind == "run" else child_serve
        print(json.dumps(fn(threads, int(tokens), float(max_s))))
        return
    from busy_load import load

    loads, kinds, threads = args.loads.split(","), args.kinds.split(","), args.threads.split(",")
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; each configuration a fresh "
        f"process, one reply of {args.tokens} tokens cut at {args.max_s:.0f} s",
        flush=True,
    )
    results: dict = {}
    t0 = time.monotonic()
    for i, name in enumerate(loads):
        per_load = len(kinds) * len(threads) * (args.max_s + 30)
        with load(name, seconds=per_load + 60):
            time.sleep(2.0)
            for kind in kinds:
                order = threads if i % 2 == 0 else list(reversed(threads))
                for t in order:
                    r = results[(name, kind, t)] = run_child(kind, t, args.tokens, args.max_s)
                    print(f"{name:<9}{kind:<6}threads {t:<5}" + _row("", r)[2:], flush=True)
    print(f"\n{(time.monotonic() - t0) / 60:.1f} min in all; load average {os.getloadavg()[0]:.1f} at the end")
    report(results, loads, kinds)


if __name__ == "__main__":
    main()
