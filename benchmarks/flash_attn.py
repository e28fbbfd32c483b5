"""Flash attention on vs off in loopchat's engine (issue 25, item 0), on both test models.

For each model, one process loads two engines of the same file, one with flash attention
on and one with it off (`Engine(flash_attn=...)`; what llama.cpp resolved is printed), on
the main thread, and runs one reply on each at once, **pass by pass**: a forward pass of
one, then one of the other, so whatever else the machine runs falls on both alike, pass
for pass (on a shared machine whose load moves by the second, replies run one after the
other measured the load, not the setting). Each reply: --tokens tokens (ignore_eos,
temperature 0.7, seed fixed) after a ~730-token prompt evaluated in full (no KV-cache
reuse); rounds alternate which engine goes first. Per engine: the prefill's tok/s
(Prefill.evaluated_tokens / Prefill.ms), the median forward pass (Step.forward_ms) and
the decode tok/s of its own passes (steps / the sum of forward_ms + sample_ms: the wall
clock of an interleaved reply includes the other engine's passes), the median CPU time of a
step on the engine's thread (time.thread_time(): at 1 llama thread the pass runs on it,
so this is the work done, which the machine's other load barely moves), and both medians
for each quarter of the reply (the context grows a token a pass: attention's cost with it). The figure that
counts is the on/off ratio of the decode tok/s, round by round, measured side by side.
Conditions: `quiet` (whatever else runs: the load average is printed) and `busy`
(beside one more CPU-bound process, tests/cpu_burners.py), both at --threads (default 1
busy, 2 quiet).

    .venv/bin/python benchmarks/flash_attn.py [--models default,gemma] [--loads quiet,busy] [--rounds 2] [--tokens 1000] [--threads N] [--short]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from cpu_burners import cpu_burners  # noqa: E402
from gemma_model import gemma_path  # noqa: E402

from loopchat.engine.engine import Engine  # noqa: E402
from loopchat.events import Event, Finish, Message, Pending, Prefill, Step  # noqa: E402
from loopchat.model_files import builtin_model_path  # noqa: E402
from loopchat.settings import SamplingSettings  # noqa: E402

THREADS = {"quiet": 2, "busy": 1}
PROMPT = (
    "Here is a long text to summarise at the end. "
    + " ".join(
        f"Paragraph {i}: the river ran past the old mill, where the miller counted sacks of grain." for i in range(30)
    )
    + " Now write a very long story about the miller."
)


def _model(name: str) -> Path:
    return builtin_model_path("smollm2-135m-instruct") if name == "default" else gemma_path()


SHORT_PROMPT = "Write a very long story about a lighthouse keeper and a storm."
_prompt = [PROMPT]  # --short: SHORT_PROMPT (~40 tokens: the quarters then span contexts ~40 to ~1,040)


def _reply(engine: Engine, tokens: int) -> Iterator[Event | Pending]:
    settings = SamplingSettings(temperature=0.7, max_tokens=tokens, seed=7)
    return engine.generate([Message("user", _prompt[0])], settings, ignore_eos=True, reuse_at_most=0)


def interleaved(engines: dict[str, Engine], order: tuple[str, str], tokens: int) -> dict[str, dict[str, float]]:
    """One reply on each engine, a pass of one then a pass of the other."""
    runs = {fa: _reply(engines[fa], tokens) for fa in order}
    passes: dict[str, list[float]] = {fa: [] for fa in order}
    busy: dict[str, float] = {fa: 0.0 for fa in order}
    out: dict[str, dict[str, float]] = {fa: {} for fa in order}
    live = list(order)
    cpu: dict[str, list[float]] = {fa: [] for fa in order}
    while live:
        for fa in list(live):
            t0 = time.thread_time()  # this thread's CPU: at 1 llama thread, the pass's own work
            for ev in runs[fa]:  # up to and including its next Step (one pass) or its Finish
                if isinstance(ev, Prefill):
                    out[fa]["prefill_tok_s"] = ev.evaluated_tokens / (ev.ms / 1000)
                elif isinstance(ev, Step):
                    if ev.index > 0:
                        passes[fa].append(ev.forward_ms)
                        busy[fa] += ev.forward_ms + ev.sample_ms
                        cpu[fa].append((time.thread_time() - t0) * 1000)
                    break
                elif isinstance(ev, Finish):
                    out[fa]["steps"] = ev.steps
                    live.remove(fa)
                    break
            else:
                live.remove(fa)
    for fa in order:
        out[fa]["forward_ms"] = statistics.median(passes[fa])
        out[fa]["tok_s"] = len(passes[fa]) / (busy[fa] / 1000)
        out[fa]["cpu_ms"] = statistics.median(cpu[fa])
        # by the reply's position (the context grows by one token a pass): median forward ms
        # and CPU ms of each quarter of the reply
        q = max(1, len(passes[fa]) // 4)
        for k in range(4):
            out[fa][f"forward_ms_q{k + 1}"] = statistics.median(passes[fa][k * q : (k + 1) * q] or [float("nan")])
            out[fa][f"cpu_ms_q{k + 1}"] = statistics.median(cpu[fa][k * q : (k + 1) * q] or [float("nan")])
    return out


def measure(model: str, load: str, rounds: int, tokens: int, threads: int | None) -> dict:
    threads = threads or THREADS[load]
    engines = {fa: Engine(_model(model), flash_attn=fa, threads=threads, n_ctx=2048) for fa in ("on", "off")}
    runs: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    loads = []
    try:
        for r in range(rounds):
            order = ("on", "off") if r % 2 == 0 else ("off", "on")  # alternate who goes first
            got = interleaved(engines, order, tokens)
            loads.append(os.getloadavg()[0])
            for fa in order:
                runs[fa].append(got[fa])
                print(f"  {model} {load} round {r + 1} fa {fa}: {json.dumps(got[fa])}", flush=True)
    finally:
        resolved = {fa: e.flash_attn for fa, e in engines.items()}
        for e in engines.values():
            e.close()
    med = {fa: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for fa, rs in runs.items()}
    ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(runs["on"], runs["off"], strict=True)]
    pre = [a["prefill_tok_s"] / b["prefill_tok_s"] for a, b in zip(runs["on"], runs["off"], strict=True)]
    return {
        "model": model,
        "load": load,
        "threads": threads,
        "resolved": resolved,
        "median": med,
        "decode_ratio_per_round": ratios,
        "decode_ratio": statistics.median(ratios),
        "prefill_ratio": statistics.median(pre),
        "loadavg_median": statistics.median(loads),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="default,gemma")
    ap.add_argument("--loads", default="quiet,busy")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument(
        "--threads", type=int, default=None, help="llama.cpp threads in every load (default: quiet 2, busy 1)"
    )
    ap.add_argument("--short", action="store_true", help="a ~40-token prompt instead of the ~730-token one")
    args = ap.parse_args()
    if args.short:
        _prompt[0] = SHORT_PROMPT
    results = []
    for load in args.loads.split(","):
        for model in args.models.split(","):
            if load == "busy":
                with cpu_burners(1, seconds=3600):
                    results.append(measure(model, load, args.rounds, args.tokens, args.threads))
            else:
                results.append(measure(model, load, args.rounds, args.tokens, args.threads))
            res = results[-1]
            on, off = res["median"]["on"], res["median"]["off"]
            print(
                f"{model:8} {load:6} threads {res['threads']} · decode on {on['tok_s']:.1f} / off {off['tok_s']:.1f} "
                f"tok/s (ratio {res['decode_ratio']:.3f}; per round {', '.join(f'{x:.3f}' for x in res['decode_ratio_per_round'])}) · "
                f"forward {on['forward_ms']:.2f} / {off['forward_ms']:.2f} ms · CPU per step {on['cpu_ms']:.2f} / {off['cpu_ms']:.2f} ms · prefill on {on['prefill_tok_s']:.0f} / "
                f"off {off['prefill_tok_s']:.0f} tok/s (ratio {res['prefill_ratio']:.3f}) · load avg {res['loadavg_median']:.2f}",
                flush=True,
            )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
