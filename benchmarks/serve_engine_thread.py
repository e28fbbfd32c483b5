"""The engine thread's CPU per token beside the forward pass, for a lone request as `loopchat
serve --parallel 4` runs it (a SharedRun with one ticket), in-process, at the settings
serve_vs_llama_server.py sends (temperature 0.7, top-k 40, top-p 0.95, min-p 0.05, no penalty,
no DRY, top_logprobs 5 without the extension: report_k 5).

Each round is one reply of --tokens tokens (ignore_eos) after the same prompt (the first round
warms up and is not counted); the engine thread's time is `time.thread_time_ns` (its CPU, not
the wall), llama_decode's own is timed around each call, and "beside the pass" is the
difference per token. At 1 llama thread the pass runs on the engine thread. Run it from two
trees in turn (PYTHONPATH=<tree>/src, as serve_cpu_trees.py does) to compare two versions:

    PYTHONPATH=/tmp/base/src .venv/bin/python benchmarks/serve_engine_thread.py [--rounds 3] [--parts]

`--parts` also times the chain (sampler._sample) and the Step (ReplyRun.record) on their own.
`--requests N`: N requests submitted together (a pass of N once they have joined: the shared
batch's path, slot_host.py), each of --tokens tokens; every llama_decode (the prefills' and the
batched passes' too) is "the pass" then, and the figures are per token of any request.
`--extension`: the requests as a served request with the extension on asks them (report_k 20,
the batch's probes), not off. Prints one JSON object: medians over the rounds, µs per token.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import llama_cpp

from loopchat.engine import _batch_ffi, _llama_ffi, sampler
from loopchat.engine import run as run_module
from loopchat.engine.engine import Engine
from loopchat.engine.shared_batch import Ticket
from loopchat.engine.shared_run import SharedRun
from loopchat.events import Message, Step
from loopchat.model_files import builtin_model_path
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings

SETTINGS = dict(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, dry_multiplier=0.0)


def timed(owner: Any, name: str, into: dict[str, list[int]], key: str) -> None:
    """Wrap owner.name so that each call's thread CPU time is added to into[key]."""
    f: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.thread_time_ns()
        try:
            return f(*args, **kwargs)
        finally:
            into.setdefault(key, []).append(time.thread_time_ns() - t)

    setattr(owner, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="replies counted (after one not counted)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--parts", action="store_true", help="the chain and the Step timed on their own too")
    ap.add_argument("--requests", type=int, default=1, help="requests submitted together (a shared batch)")
    ap.add_argument("--extension", action="store_true", help="report_k 20 and the batch's probes (extension on)")
    args = ap.parse_args()
    engine = Engine(builtin_model_path("smollm2-135m-instruct"), n_ctx=4096, threads=1)
    times: dict[str, list[int]] = {}
    if args.requests == 1:
        timed(engine._c, "decode_one", times, "pass")
    else:  # every decode: the prefills (Llama.eval's and the joint one), the batched passes, the probes
        timed(_llama_ffi, "decode", times, "pass")
        _batch_ffi.decode = _llama_ffi.decode
        timed(llama_cpp.llama_cpp, "llama_decode", times, "pass")
    if args.parts:
        timed(sampler, "_sample", times, "chain")
        timed(run_module.ReplyRun, "record", times, "step_record")
    settings = dataclasses.replace(SamplingSettings(), max_tokens=args.tokens, seed=7, **SETTINGS)
    k, probes = (20, True) if args.extension else (5, False)
    prompts = ["Write a story about the sea.", "Tell me about cats.", "What is rain?", "Describe a tree."]
    # (as `loopchat serve` asks: the step detail with the extension only; a tree from before it: none)
    detail = {"step_detail": probes} if "step_detail" in ReplyRequest.__dataclass_fields__ else {}
    requests = [
        ReplyRequest(
            (Message("user", prompts[j % 4]),), settings, ignore_eos=True, report_k=k, batch_probes=probes, **detail
        )
        for j in range(args.requests)
    ]
    rows = []
    for i in range(args.rounds + 1):
        times.clear()
        events: list[Any] = []
        shared = SharedRun(max(4, args.requests))
        for j, request in enumerate(requests):
            shared.submit(Ticket(j + 1, request, events.append))
        t0 = time.thread_time_ns()
        shared.serve(engine)
        total = time.thread_time_ns() - t0
        n = sum(isinstance(e, Step) for e in events)
        if i == 0:
            continue
        row = {"beside_pass_us": (total - sum(times["pass"])) / n / 1e3}
        row.update({f"{k}_us": sum(v) / n / 1e3 for k, v in times.items()})
        rows.append(row)
    engine.close()
    print(json.dumps({k: round(statistics.median(r[k] for r in rows), 1) for k in rows[0]}))


if __name__ == "__main__":
    main()
