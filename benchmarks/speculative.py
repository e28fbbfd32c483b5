"""Speculative decoding against the plain loop (issue 25, item 1): decode rate, acceptance,
draft lengths chosen, identical text, and the ceiling the measured acceptance and pass costs
allow.

Tasks (the default model, temperature 0):
- repeat: "Repeat the following text exactly: " + ~400 tokens of text (penalties off: a
  copying reply);
- code: "Rename the variable x to count in this code:" + a 60-line Python block (penalties off);
- story: a free story of 1,000 tokens (the model's own settings at temperature 0, the end
  token ignored): drafting must back off there.

Each task runs draft off and lookup (and model with --draft-model), alternating, `--rounds`
times, quiet and then beside one CPU-bound process (`while True: pass`). The ceiling: the
pass costs c(n): c(1) the plain replies' own forward passes (median), c(n) that times the ratio
c(n) / c(1) of a bare llama_decode of n positions with logits at each (measured after the
replies, after the task's prompt, median of 9 taken round robin over n: a bare c(1) measured
minutes later was up to 15% off the replies' own), the loop's own cost per token s (the plain
run's ms per token minus c(1)), and the measured per-draft acceptance a
(kept / (kept + refused)): max over k of E(k) / (c(k+1) + E(k) s), E(k) = 1 + a + ... + a^k,
against one token per c(1) + s. That formula takes each draft as kept independently; a copy's
refusals are not (they fall at fixed places: a renamed word, an index that changes), so beside it
the replayed ceiling: the plain reply's own tokens (identical at temperature 0) drafted by prompt
lookup with a fixed length k, each pass costing c(drafts + 1) + s a token it gives, the best k
(what a pace that knew the reply's k beforehand, but not each pass's, would make; a pace that
varies k can beat it). The costs are made non-decreasing in n (pooled where a longer pass came
out cheaper: a busy minute's noise) before either ceiling. The reply's own rate is
Finish.tokens_per_s. Beside it, the reply's own verifying passes: their median ms by positions
checked (PassReport.ms).

    .venv/bin/python benchmarks/speculative.py [--threads 2] [--rounds 3] [--draft-model PATH]
        [--tasks repeat,code,story] [--quiet-only | --busy-only]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from busy_load import burners  # noqa: E402

from loopchat.engine.draft_model import open_draft_model  # noqa: E402
from loopchat.engine.drafts import LookupDrafter  # noqa: E402
from loopchat.engine.engine import Engine  # noqa: E402
from loopchat.events import Finish, Message, Start, Step  # noqa: E402
from loopchat.model_files import builtin_model_path  # noqa: E402
from loopchat.model_spec import SMOLLM2_SAMPLING  # noqa: E402
from loopchat.pass_lines import pass_figures  # noqa: E402
from loopchat.settings import SamplingSettings  # noqa: E402

SENTENCES = [
    "The lighthouse keeper climbed the stairs every evening at six.",
    "He lit the lamp, wiped the glass, and wrote the weather in his book.",
    "On calm nights the sea was silver and the ships passed far away.",
    "On stormy nights the waves broke against the rocks and the wind howled around the tower.",
    "In the morning he put out the lamp, ate his bread and cheese, and slept until noon.",
    "Then he mended the nets, painted the railings, and fed the gulls that waited on the roof.",
    "Once a year a boat brought oil, flour, letters and news from the town.",
    "He read the letters slowly, twice, and kept them in a tin box under his bed.",
    "His sister wrote about her garden, her children, and the price of fish at the market.",
    "His old captain wrote about the war, the cold winters, and the friends who had not come home.",
    "When the boat left again he stood on the rocks and watched it until it was a dot on the water.",
    "Then he climbed the stairs, lit the lamp, and wrote the weather in his book, as he always did.",
]
TEXT = " ".join(SENTENCES * 2)  # ~400 tokens
CODE = "\n".join(
    ["def summarize(values, limit):", "    x = 0"]
    + [f"    if values[{i}] > limit:\n        x = x + values[{i}]\n    else:\n        x = x - 1" for i in range(14)]
    + ["    return x"]
)  # 60 lines
COPY = SamplingSettings(temperature=0.0, repeat_penalty=1.0, dry_multiplier=0.0)
TASKS = {
    "repeat": ([Message("user", "Repeat the following text exactly: " + TEXT)], COPY.replace(max_tokens=600), False),
    "code": (
        [Message("user", "Rename the variable x to count in this code:\n```python\n" + CODE + "\n```")],
        COPY.replace(max_tokens=700),
        False,
    ),
    "story": (
        [Message("user", "Write a long story about a lighthouse keeper and a storm.")],
        SMOLLM2_SAMPLING.replace(temperature=0.0, max_tokens=1000),
        True,
    ),
}


def reply(engine: Engine, messages: list[Message], settings: SamplingSettings, ignore_eos: bool) -> dict:
    events = list(engine.generate(messages, settings, ignore_eos=ignore_eos))
    steps = [e for e in events if isinstance(e, Step)]
    finish = next(e for e in events if isinstance(e, Finish))
    start = next(e for e in events if isinstance(e, Start))
    fig = pass_figures(steps)
    reports = {s.pass_report.number: s.pass_report for s in steps if s.pass_report}
    refused = sum(1 for r in reports.values() if r.kept < r.drafted)
    return {
        "rate": finish.tokens_per_s,
        "tokens": len(steps),
        "text": finish.text,
        "fig": fig,
        "a": fig.kept / (fig.kept + refused) if fig.kept + refused else None,
        "ks": [r.drafted for r in reports.values()],
        "prompt": engine.n_past - len(steps),
        "costs": reply_costs(steps),
        "context": [*start.prompt_token_ids, *(s.token_id for s in steps)],
        "forward_ms": statistics.median(s.forward_ms for s in steps[1:] if s.forward_ms),
    }


def pass_costs(engine: Engine, messages: list[Message], n_max: int = 9) -> dict[int, float]:
    """c(n): ms of a bare llama_decode of n positions (logits at each) after the prompt."""
    prompt = engine.fit_prompt(messages, 1).tokens
    engine.reset()
    engine.evaluate(prompt)
    engine.sync()
    times: dict[int, list[float]] = {n: [] for n in range(1, n_max + 1)}
    for _ in range(9):  # round robin over n: a change of the load over the minute moves every c(n) alike
        for n in times:
            engine.trim(len(prompt))
            t0 = time.perf_counter()
            engine.evaluate_scored(prompt[-n:])
            engine.sync()
            times[n].append((time.perf_counter() - t0) * 1000.0)
    engine.reset()
    return monotone({n: statistics.median(t) for n, t in times.items()})


def monotone(costs: dict[int, float]) -> dict[int, float]:
    """The costs made non-decreasing in n: adjacent values out of order pooled to their mean
    (pool-adjacent-violators), as a pass of more positions does not cost less."""
    blocks: list[list[float]] = []  # [sum, count]
    for n in sorted(costs):
        blocks.append([costs[n], 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    out: list[float] = []
    for total, count in blocks:
        out += [total / count] * int(count)
    return dict(zip(sorted(costs), out, strict=True))


def replayed_ceiling(context: list[int], n_reply: int, costs: dict[int, float], s: float) -> tuple[float, int]:
    """(the best rate over plain a fixed draft length gives on the reply's own tokens, that k)."""
    start, drafter = len(context) - n_reply, LookupDrafter()
    plain_ms = n_reply * (costs[1] + s)
    best, best_k = 1.0, 0
    for k in range(1, max(costs)):
        i, ms = start, 0.0
        while i < len(context):
            drafts = drafter.propose(context[:i], min(k, len(context) - i - 1)) if i < len(context) - 1 else []
            kept = 0
            while kept < len(drafts) and drafts[kept] == context[i + kept]:
                kept += 1
            ms += costs[len(drafts) + 1] + (kept + 1) * s
            i += kept + 1
        if plain_ms / ms > best:
            best, best_k = plain_ms / ms, k
    return best, best_k


def reply_costs(steps: list[Step]) -> dict[int, tuple[float, int]]:
    """The reply's own verifying passes: positions checked (drafts + 1) -> (median ms, count)."""
    by_n: dict[int, list[float]] = {}
    seen: set[int] = set()
    for step in steps:
        r = step.pass_report
        if r is not None and r.number not in seen:
            seen.add(r.number)
            by_n.setdefault(r.drafted + 1, []).append(r.ms)
    return {n: (statistics.median(ms), len(ms)) for n, ms in sorted(by_n.items())}


def ceiling(costs: dict[int, float], plain_rate: float, a: float | None) -> tuple[float, int]:
    """(the best rate over plain's the measured acceptance and costs allow, the k for it)."""
    s = max(0.0, 1000.0 / plain_rate - costs[1])
    a = 0.0 if a is None else a
    best, best_k = 1.0, 0
    for k in range(1, max(costs)):
        e = float(k + 1) if a >= 1.0 else (1 - a ** (k + 1)) / (1 - a)
        gain = e / (costs[k + 1] + e * s) * (costs[1] + s)
        if gain > best:
            best, best_k = gain, k
    return best, best_k


def same_text(rs: list[dict], plain: list[dict]) -> bool:
    return all(r["text"] == o["text"] for r, o in zip(rs, plain, strict=True))


def run(engine: Engine, rounds: int, drafts: list[str], label: str, tasks: list[str]) -> None:
    print(f"\n== {label}: threads {engine.threads}")
    for name in tasks:
        messages, settings, ignore_eos = TASKS[name]
        results: dict[str, list[dict]] = {d: [] for d in drafts}
        for _ in range(rounds):
            for d in drafts:
                engine.reset()
                results[d].append(reply(engine, messages, settings.replace(draft=d), ignore_eos))
        bare = pass_costs(engine, messages)
        plain = statistics.median(r["rate"] for r in results["off"])
        # c(1): the plain replies' own forward passes; c(n): the bare passes' ratios to c(1) at that
        # c(1) (the bare passes, measured minutes later, drift with the load)
        loop_c1 = statistics.median(r["forward_ms"] for r in results["off"])
        costs = {n: c * loop_c1 / bare[1] for n, c in bare.items()}
        print(
            f"{name}: {results['off'][0]['tokens']} tokens · plain {plain:.1f} tok/s · pass costs "
            + " ".join(f"c({n})={c:.1f}" for n, c in costs.items())
            + f" ms (bare c(1) {bare[1]:.1f} ms, scaled to the plain replies' own passes)"
        )
        for d in drafts[1:]:
            rs = results[d]
            rate = statistics.median(r["rate"] for r in rs)
            kept = sum(r["fig"].kept for r in rs)
            drafted = sum(r["fig"].drafted for r in rs)
            a_values = [r["a"] for r in rs if r["a"] is not None]
            a = statistics.mean(a_values) if a_values else None
            top, k_best = ceiling(costs, plain, a)
            s_ms = max(0.0, 1000.0 / plain - costs[1])
            replay = rs[-1]["context"] if d == "lookup" and same_text(rs, results["off"]) else None
            again, k_again = replayed_ceiling(replay, rs[-1]["tokens"], costs, s_ms) if replay else (None, 0)
            ks = [k for r in rs for k in r["ks"]]
            same = same_text(rs, results["off"])
            acceptance = f"{kept / drafted:.2f}" if drafted else "-"
            print(
                f"  {d}: {rate:.1f} tok/s = {rate / plain:.2f}x plain · ceiling {top:.2f}x (k={k_best}) · "
                f"{rate / plain / top:.2f} of it · acceptance {acceptance} ({kept}/{drafted}) · "
                f"tok/pass {statistics.mean(r['fig'].tokens_per_pass for r in rs):.2f} · "
                f"k chosen median {statistics.median(ks) if ks else 0} (max {max(ks, default=0)}) · "
                f"verifying passes {sum(r['fig'].verifying for r in rs)} · identical text {same}"
            )
            print("    k chosen: " + " ".join(f"{k}x{n}" for k, n in sorted(Counter(ks).items())))
            if again is not None:
                print(
                    f"    replayed ceiling (best fixed k on the reply's tokens): {again:.2f}x (k={k_again}) · "
                    f"{rate / plain / again:.2f} of it"
                )
            seen = rs[-1]["costs"]
            if seen:
                print(
                    "    its own verifying passes (last round): "
                    + " ".join(f"c({n})={ms:.1f} ms x{count}" for n, (ms, count) in seen.items())
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--draft-model", help="a GGUF with the model's vocabulary: draft = model too")
    ap.add_argument("--busy-only", action="store_true")
    ap.add_argument("--quiet-only", action="store_true")
    ap.add_argument("--tasks", default=",".join(TASKS), help="which of " + ", ".join(TASKS))
    args = ap.parse_args()
    engine = Engine(builtin_model_path(), n_ctx=4096, threads=args.threads)
    drafts = ["off", "lookup"]
    if args.draft_model:
        engine.draft_model = open_draft_model(engine, args.draft_model)
        drafts.append("model")
    try:
        tasks = args.tasks.split(",")
        if not args.busy_only:
            run(engine, args.rounds, drafts, "quiet", tasks)
        if not args.quiet_only:
            with burners(1, 3600):
                run(engine, args.rounds, drafts, "beside one CPU-bound process", tasks)
    finally:
        engine.close()


if __name__ == "__main__":
    main()
