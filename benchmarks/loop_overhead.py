"""What does per-step instrumentation cost? Ratios measured side by side in one run.

(a) llama-cpp-python's own `Llama.generate` (sampler chain in C, no probabilities), and
(b) the loopchat engine with full per-step instrumentation (raw + sampled top-K,
    entropies, ranks, timings, live settings), both on the same `Llama` object, the same
    thread count and the same sampling settings, alternating several times.
Decode tokens/s = (tokens - 1) / (time from the first token to the last), for both.
Target: b/a >= 0.97.

Optionally (c) llama.cpp's own `llama-bench` tg figure at the same thread count
(build it with benchmarks/build_llama_bench.sh; pass --llama-bench PATH). Target b/c >= 0.95.

    .venv/bin/python benchmarks/loop_overhead.py [--tokens 256] [--rounds 5] [--llama-bench PATH]
    .venv/bin/python benchmarks/loop_overhead.py --sweep [--model FILE.gguf | --model gemma] [--json-schema FILE] [--repeat R]

--sweep: the sampling chain's cost against the forward pass for each combination of
settings (top-k on/off, top-p, min-p, temperature, --top-report 10/40, DRY off / 0.8 over
the whole context): the median of
sample_ms / forward_ms over the decode steps of one reply each. Target: every
combination < 0.10. With --json-schema (e.g. benchmarks/story_schema.json) every reply
follows that schema (the constraint stage in the chain, issue 24), and the mask alone
(llguidance's bitmask and its unpacking, per pass over the replies' tokens) is timed too.
--repeat R: the grid R times; a combination's figure is then the median of its R replies' ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from loopchat.constraint import Constraint, read_constraint  # noqa: E402
from loopchat.engine.cores import physical_cores  # noqa: E402
from loopchat.engine.engine import Engine  # noqa: E402
from loopchat.events import Finish, Message, Start  # noqa: E402
from loopchat.model_files import builtin_model_path  # noqa: E402
from loopchat.settings import SamplingSettings  # noqa: E402

MESSAGES = [
    Message("system", "You are a helpful assistant."),
    Message("user", "Write a long story about a lighthouse keeper and a storm."),
]


def llama_generate_rate(engine: Engine, prompt_ids: list[int], s: SamplingSettings, n: int) -> float:
    llm = engine.llm
    llm.set_seed(s.seed)
    llm.last_n_tokens_size = s.repeat_last_n
    t_first = t_last = 0.0
    count = 0
    for _token in llm.generate(
        prompt_ids,
        top_k=s.top_k,
        top_p=s.top_p,
        min_p=s.min_p,
        temp=s.temperature,
        repeat_penalty=s.repeat_penalty,
        reset=True,
    ):
        count += 1
        t_last = time.perf_counter()
        if count == 1:
            t_first = t_last
        if count >= n:
            break
    return (count - 1) / (t_last - t_first)


def engine_rate(engine: Engine, s: SamplingSettings, n: int) -> float:
    finish = None
    for event in engine.generate(MESSAGES, s.replace(max_tokens=n), ignore_eos=True):
        if isinstance(event, Finish):
            finish = event
    assert finish is not None and finish.steps == n, finish
    return finish.tokens_per_s


def bare_decode_rate(engine: Engine, prompt_ids: list[int], n: int) -> float:
    """A Python loop doing nothing but llama_decode on a fixed token: the ceiling for any
    per-token loop written in Python."""
    engine.reset()
    engine._eval(prompt_ids)
    t0 = time.perf_counter()
    for _ in range(n - 1):
        engine._decode_one(42)
        engine._sync()
    return (n - 1) / (time.perf_counter() - t0)


def llama_bench_rate(binary: str, model: Path, threads: int, n: int, reps: int) -> float:
    out = subprocess.run(
        [binary, "-m", str(model), "-t", str(threads), "-p", "0", "-n", str(n), "-r", str(reps), "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = json.loads(out)
    return float(rows[0]["avg_ts"])


def mask_times(engine: Engine, constraint: Constraint, replies: list[list[int]]) -> tuple[list[float], list[float]]:
    """ms of the constraint's mask alone at each pass of these replies (their tokens replayed
    through a fresh matcher: the mask depends on the grammar's state only): (each reply's
    first pass, the others)."""
    first, later = [], []
    for tokens in replies:
        stage = engine.open_constraint(constraint)
        for i, t in enumerate(tokens):
            t0 = time.perf_counter()
            stage.allowed_bits()
            (later if i else first).append((time.perf_counter() - t0) * 1000.0)
            if engine.is_eog(t) or not stage.consume(t) or stage.stopped:
                break
    return first, later


def sweep(model: Path, threads: int | None, tokens: int, schema: Path | None = None, repeat: int = 1) -> None:
    """sample_ms / forward_ms for each combination (median over a reply's decode steps); with
    `repeat` > 1 the grid runs that many times and a combination's figure is the median of its
    replies' ratios (one slow stretch of a shared machine then decides no combination alone)."""
    import itertools

    engine = Engine(model, n_ctx=2048, threads=threads, log_path=Path("/dev/null"))
    constraint = read_constraint("json_schema", schema) if schema else None
    replies: list[list[int]] = []
    print(f"model {model.name}, vocabulary {engine.n_vocab}, threads {engine.threads}, {tokens} tokens per reply")
    if constraint is not None:
        print(f"every reply follows {constraint.label()}")
    grid = list(itertools.product((40, 0), (0.95, 1.0), (0.05, 0.0), (0.7, 2.0), (10, 40), (0.0, 0.8)))
    ratios: dict[tuple, list[float]] = {combo: [] for combo in grid}
    for r in range(repeat):
        if repeat > 1:
            print(f"round {r + 1} of {repeat}")
        print(
            f"{'top_k':>6} {'top_p':>6} {'min_p':>6} {'temp':>5} {'report':>6} {'dry':>4}  {'sample ms':>9} {'forward ms':>10}  ratio"
        )
        for combo in grid:
            sample, forward, tokens_of = _sweep_reply(engine, combo, tokens, constraint)
            replies.append(tokens_of)
            ratios[combo].append(sample / forward)
            print(
                f"{combo[0]:>6} {combo[1]:>6} {combo[2]:>6} {combo[3]:>5} {combo[4]:>6} {combo[5]:>4}  {sample:9.2f} {forward:10.1f}  {sample / forward:.3f}"
            )
    worst = max(statistics.median(v) for v in ratios.values())
    if repeat > 1:
        top = sorted(ratios, key=lambda c: -statistics.median(ratios[c]))[:3]
        print("the worst combinations, the median of their rounds' ratios (each round's in brackets):")
        for c in top:
            print(f"  {c}: {statistics.median(ratios[c]):.3f} ({', '.join(f'{x:.3f}' for x in ratios[c])})")
    print(f"worst ratio {worst:.3f} (target < 0.10)")
    if constraint is not None:
        first, later = mask_times(engine, constraint, replies)
        print(
            f"the mask alone: median {statistics.median(later):.3f} ms, worst {max(later):.3f} ms over {len(later)} passes"
        )
        print(f"  a reply's first pass (the matcher's first mask): median {statistics.median(first):.3f} ms")
    engine.close()


def _sweep_reply(
    engine: Engine, combo: tuple, tokens: int, constraint: Constraint | None
) -> tuple[float, float, list[int]]:
    """One reply of the sweep: (the median sample ms, the median forward ms over its decode steps, its tokens)."""
    from loopchat.events import Step

    top_k, top_p, min_p, temp, report, dry = combo
    s = SamplingSettings(
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        temperature=temp,
        seed=1,
        max_tokens=tokens,
        dry_multiplier=dry,
        dry_penalty_last_n=2048,
    )
    events = engine.generate(MESSAGES, s, report_k=report, ignore_eos=True, constraint=constraint)
    every = [e for e in events if isinstance(e, Step)]
    steps = every[1:]
    sample = statistics.median(st.sample_ms for st in steps)
    forward = statistics.median(st.forward_ms for st in steps)
    return sample, forward, [st.token_id for st in every]


def model_path(name: str | None) -> Path:
    """--model: a GGUF file; `gemma`: Gemma 3 270M as `make test` / `make bench` assemble it
    (tests/gemma_model.py); none: the bundled model."""
    if not name:
        return builtin_model_path()
    if name != "gemma":
        return Path(name)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from gemma_model import gemma_path

    try:
        return gemma_path()
    except FileNotFoundError as exc:
        raise SystemExit(str(exc)) from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    # pinned: the comparisons are at equal, fixed thread counts (auto would change the
    # count between passes; benchmarks/busy_machine.py measures auto)
    ap.add_argument("--threads", type=int, default=physical_cores(), help="default: physical cores")
    ap.add_argument("--llama-bench", metavar="PATH", help="llama.cpp's llama-bench binary (same build flags)")
    ap.add_argument("--sweep", action="store_true", help="sample_ms / forward_ms for each combination of settings")
    ap.add_argument("--json-schema", metavar="FILE", type=Path, help="--sweep: every reply follows this schema")
    ap.add_argument(
        "--repeat", type=int, default=1, help="--sweep: the grid this many times, each combination's median"
    )
    ap.add_argument(
        "--model",
        metavar="FILE.gguf",
        help="another GGUF file, or `gemma`: the tests' Gemma 3 270M (default: the bundled model)",
    )
    args = ap.parse_args()

    model = model_path(args.model)
    if args.sweep:
        sweep(model, args.threads, min(args.tokens, 64), args.json_schema, args.repeat)
        return
    engine = Engine(model, n_ctx=2048, threads=args.threads, log_path=Path("/dev/null"))
    settings = SamplingSettings(seed=1)
    start = next(e for e in engine.generate(MESSAGES, settings.replace(max_tokens=1)) if isinstance(e, Start))
    prompt_ids = list(start.prompt_token_ids)
    print(f"model {model.name}, threads {engine.threads}, {args.tokens} tokens per run, {args.rounds} rounds")
    print(f"settings: {settings.to_dict()}")

    # warm-up
    engine_rate(engine, settings, 32)
    llama_generate_rate(engine, prompt_ids, settings, 32)

    a_rates: list[float] = []
    b_rates: list[float] = []
    ratios: list[float] = []
    for r in range(args.rounds):
        if r % 2 == 0:
            a = llama_generate_rate(engine, prompt_ids, settings, args.tokens)
            b = engine_rate(engine, settings, args.tokens)
        else:
            b = engine_rate(engine, settings, args.tokens)
            a = llama_generate_rate(engine, prompt_ids, settings, args.tokens)
        a_rates.append(a)
        b_rates.append(b)
        ratios.append(b / a)
        print(f"round {r + 1}: Llama.generate {a:7.1f} tok/s   loopchat engine {b:7.1f} tok/s   b/a {b / a:.3f}")
    print(
        f"median: Llama.generate {statistics.median(a_rates):.1f} tok/s, loopchat engine "
        f"{statistics.median(b_rates):.1f} tok/s, b/a {statistics.median(ratios):.3f} (target >= 0.97)"
    )
    if args.llama_bench:
        rows = []
        for _ in range(3):
            c = llama_bench_rate(args.llama_bench, model, engine.threads, args.tokens, 2)
            b_now = engine_rate(engine, settings, args.tokens)
            a_now = llama_generate_rate(engine, prompt_ids, settings, args.tokens)
            d_now = bare_decode_rate(engine, prompt_ids, args.tokens)
            rows.append((c, b_now, a_now, d_now))
            print(
                f"llama-bench tg{args.tokens} {c:6.1f} tok/s | engine {b_now:6.1f} (b/c {b_now / c:.3f}) | "
                f"Llama.generate {a_now:6.1f} ({a_now / c:.3f}) | bare Python decode loop {d_now:6.1f} ({d_now / c:.3f})"
            )
        med = lambda i: statistics.median(r[i] / r[0] for r in rows)  # noqa: E731
        print(
            f"median vs llama-bench: engine {med(1):.3f} (target >= 0.95), Llama.generate {med(2):.3f}, "
            f"bare decode loop {med(3):.3f}"
        )
    engine.close()


if __name__ == "__main__":
    main()
