"""Choose the bundled model's sampling settings on a fixed prompt set (issue 22, section 6).

Runs every prompt of benchmarks/default_settings_prompts.toml, for every seed and every
candidate setting, through the engine (the bundled SmolLM2-135M-Instruct, its system
prompt, 1 llama thread, max 512 tokens), and writes one JSON line per reply (the text,
the token ids, the finish reason) to the results file; a run that was stopped goes on
where it was (the replies already written are kept). `--table` reads the file and prints
docs/default-settings.md's table:

- short answers right: the reply holds one of the question's `expect` strings
  (case-insensitive substring);
- most repeated 8-word phrase: the largest number of times any run of 8 words occurs in
  one reply (words: runs of letters, digits and apostrophes, lowercased); the target is
  at most 2 in every reply;
- loops: replies in which repeats.py's detector (the panel's "repeating") found a run of
  at least 32 tokens that repeats an earlier one (docs/trace-format.md defines it);
- ended by itself: replies that ended with the model's end-of-turn token, not at 512.

    .venv/bin/python benchmarks/default_settings.py [--out FILE] [--candidates card,rp1.1] [--seeds 1,2,3]
    .venv/bin/python benchmarks/default_settings.py --table [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from loopchat.config import SMOLLM2_SYSTEM_PROMPT  # noqa: E402
from loopchat.events import Finish, Message, Step  # noqa: E402
from loopchat.settings import SamplingSettings  # noqa: E402

PROMPTS = HERE / "default_settings_prompts.toml"
DEFAULT_OUT = HERE / "results" / "default_settings.jsonl"

#: The model card's settings, and the candidates measured against them.
CARD = dict(temperature=0.2, top_p=0.9, top_k=50, min_p=0.0, repeat_penalty=1.0, repeat_last_n=64)
CANDIDATES: dict[str, dict] = {
    "card": CARD,
    "rp1.1": {**CARD, "repeat_penalty": 1.1, "repeat_last_n": 64},
    "rp1.2": {**CARD, "repeat_penalty": 1.2, "repeat_last_n": 64},
    "rp1.1n256": {**CARD, "repeat_penalty": 1.1, "repeat_last_n": 256},
    "rp1.1n512": {**CARD, "repeat_penalty": 1.1, "repeat_last_n": 512},
    "rp1.05n256": {**CARD, "repeat_penalty": 1.05, "repeat_last_n": 256},
    # llama.cpp's DRY (dry.py) at its usual strength, over the whole context (4096: the
    # replies measured were run with -1, the whole context, which the setting no longer takes)
    "dry0.8": {**CARD, "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 4096},
    "dry0.8rp1.1n256": {
        **CARD,
        "repeat_penalty": 1.1,
        "repeat_last_n": 256,
        "dry_multiplier": 0.8,
        "dry_base": 1.75,
        "dry_allowed_length": 2,
        "dry_penalty_last_n": 4096,
    },
    "dry0.8a3": {**CARD, "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 3, "dry_penalty_last_n": 4096},
    "dry0.8rp1.05n256": {
        **CARD,
        "repeat_penalty": 1.05,
        "repeat_last_n": 256,
        "dry_multiplier": 0.8,
        "dry_base": 1.75,
        "dry_allowed_length": 2,
        "dry_penalty_last_n": 4096,
    },
    "dry1.5": {**CARD, "dry_multiplier": 1.5, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 4096},
    "dry0.8a1": {**CARD, "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 1, "dry_penalty_last_n": 4096},
}
#: a loop, for the table: a repeated run of at least this many tokens
LOOP_TOKENS = 32


def load_prompts() -> list[dict]:
    return tomllib.loads(PROMPTS.read_text())["prompt"]


def words(text: str) -> list[str]:
    return re.findall(r"[\w']+", text.lower())


def most_repeated_phrase(text: str, n: int = 8) -> tuple[int, str]:
    """(how many times the most frequent run of n words occurs, that run)."""
    w = words(text)
    grams = Counter(tuple(w[i : i + n]) for i in range(len(w) - n + 1))
    if not grams:
        return 0, ""
    gram, count = grams.most_common(1)[0]
    return count, " ".join(gram)


def run(out: Path, names: list[str], seeds: list[int], max_tokens: int) -> None:
    from loopchat.engine.engine import Engine
    from loopchat.model_files import builtin_model_path

    done = set()
    if out.exists():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["candidate"], r["prompt"], r["seed"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    engine = Engine(builtin_model_path(), n_ctx=4096, threads=1, warmup=False)
    prompts = load_prompts()
    with out.open("a") as f:
        for name in names:
            for p in prompts:
                for seed in seeds:
                    if (name, p["id"], seed) in done:
                        continue
                    settings = SamplingSettings(**CANDIDATES[name], seed=seed, max_tokens=max_tokens)
                    msgs = [Message("system", SMOLLM2_SYSTEM_PROMPT), Message("user", p["text"])]
                    ids: list[int] = []
                    t0 = time.perf_counter()
                    for ev in engine.generate(msgs, settings):
                        if isinstance(ev, Step) and not ev.is_stop:
                            ids.append(ev.token_id)
                        elif isinstance(ev, Finish):
                            fin = ev
                    row = dict(
                        candidate=name,
                        settings=CANDIDATES[name],
                        prompt=p["id"],
                        seed=seed,
                        reason=fin.reason.value,
                        tokens=len(ids),
                        token_ids=ids,
                        text=fin.text,
                        seconds=round(time.perf_counter() - t0, 2),
                    )
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    print(name, p["id"], seed, fin.reason.value, len(ids), flush=True)
    engine.close()


def table(out: Path) -> str:
    from loopchat.engine.repeats import longest_repeat

    prompts = {p["id"]: p for p in load_prompts()}
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    lines = [
        "| candidate | settings | short answers right | replies with a phrase of 8 words > 2 times | "
        "most repeats of one 8-word phrase | loops (>= 32 tokens repeated) | ended by themselves | mean tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["candidate"] for r in rows):
        rs = [r for r in rows if r["candidate"] == name]
        short = [r for r in rs if prompts[r["prompt"]].get("expect")]
        right = sum(any(e.lower() in r["text"].lower() for e in prompts[r["prompt"]]["expect"]) for r in short)
        reps = [most_repeated_phrase(r["text"])[0] for r in rs]
        loops = sum((lr := longest_repeat(r["token_ids"])) is not None and lr.length >= LOOP_TOKENS for r in rs)
        s = rs[0]["settings"]
        desc = f"repeat_penalty {s['repeat_penalty']} over {s['repeat_last_n']}"
        if s.get("dry_multiplier"):
            desc += (
                f"; DRY {s['dry_multiplier']}, base {s['dry_base']}, allowed {s['dry_allowed_length']},"
                f" over {s['dry_penalty_last_n']}"
            )
        lines.append(
            f"| {name} | {desc} | {right}/{len(short)} | {sum(x > 2 for x in reps)}/{len(rs)} | {max(reps)} | "
            f"{loops}/{len(rs)} | {sum(r['reason'] == 'stop' for r in rs)}/{len(rs)} | "
            f"{sum(r['tokens'] for r in rs) / len(rs):.0f} |"
        )
    lines.append("")
    lines.append("Per prompt (most repeats of one 8-word phrase, per seed; * = ran to the token limit):")
    lines.append("")
    names = list(dict.fromkeys(r["candidate"] for r in rows))
    lines.append("| prompt | " + " | ".join(names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for pid in prompts:
        cells = []
        for name in names:
            rs = sorted((r for r in rows if r["candidate"] == name and r["prompt"] == pid), key=lambda r: r["seed"])
            cells.append(
                " ".join(f"{most_repeated_phrase(r['text'])[0]}{'*' if r['reason'] == 'length' else ''}" for r in rs)
            )
        lines.append(f"| {pid} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--table", action="store_true")
    a = ap.parse_args()
    if a.table:
        print(table(a.out))
        return
    run(a.out, a.candidates.split(","), [int(s) for s in a.seeds.split(",")], a.max_tokens)


if __name__ == "__main__":
    main()
