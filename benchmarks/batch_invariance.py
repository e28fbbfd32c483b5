"""Are llama.cpp's logits batch-invariant in the installed llama-cpp-python build? And what does
a pass of k positions cost? (issue 25: speculative and batched replies identical to the plain
loop at temperature 0.)

`check`: for each model, flash attention on and off, and ggml's repacked weights ("extra"
buffer types) on and off, a text's tokens after a prefix of P tokens (a short and a long
prefix: the long one puts more than 256 cells in the KV cache, where llama.cpp's attention
looks at 512 or more) are fed one position per llama_decode, the logits kept at each (the
plain loop's passes), then again as one pass of k positions (k = 2, 3, 5, 9, 17, the cache
trimmed back to P before each), and each position's row is compared with the one-position
pass's: the largest difference in a logit and whether all k rows are equal bit for bit.

`time`: the bare llama_decode (+ llama_synchronize) of a fresh ~700-token prompt (its tok/s),
then at that context a one-position pass and passes of 3, 5 and 9 positions (each with its
logits at every position, as a verifying pass keeps them), the median of --repeats, the cache
trimmed back after each. Measured in CPU time of the calling thread: use --threads 1 (ggml
then computes on the caller) on a shared machine, where wall times measure the load.

Run it in each venv to compare two builds of the wheel (llama_cpp.llama_print_system_info()
says LLAMAFILE = 1 or 0), alternating them on a shared machine:

    .venv/bin/python benchmarks/batch_invariance.py check [--threads 1] [--flash-attn off,on] [--prefixes 40,600]
    .venv/bin/python benchmarks/batch_invariance.py time [--models default,gemma] [--threads 1] [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from gemma_model import gemma_path  # noqa: E402

from loopchat.model_files import builtin_model_path  # noqa: E402

KS = (2, 3, 5, 9, 17)
_QUIET = llama_cpp.llama_log_callback(lambda *a: None)  # llama.cpp's log dropped (kept referenced)
TEXT = " ".join(
    f"Paragraph {i}: the river ran past the old mill, where the miller counted {i + 3} sacks of grain and sang."
    for i in range(40)
)


def model_path(name: str) -> Path:
    return builtin_model_path("smollm2-135m-instruct") if name == "default" else gemma_path()


class Ctx:
    """A model and one context on it, through llama.cpp's own calls (no Llama object: the
    model's use_extra_bufts and the context's flash attention set directly)."""

    def __init__(self, path: Path, threads: int, flash_attn: bool, extra_bufts: bool, n_ctx: int = 2048) -> None:
        mp = llama_cpp.llama_model_default_params()
        mp.use_extra_bufts = extra_bufts
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, 512, 512
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = 1 if flash_attn else 0
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(512, 0, 1)

    def tokens(self, text: str) -> list[int]:
        raw = text.encode()
        buf = (llama_cpp.llama_token * (len(raw) + 8))()
        n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, False)
        return list(buf[:n])

    def decode(self, tokens: list[int], pos: int, all_logits: bool = True) -> None:
        b = self.batch
        b.n_tokens = len(tokens)
        for j, t in enumerate(tokens):
            b.token[j], b.pos[j], b.n_seq_id[j], b.seq_id[j][0] = t, pos + j, 1, 0
            b.logits[j] = all_logits or j == len(tokens) - 1
        assert llama_cpp.llama_decode(self.ctx, b) == 0
        llama_cpp.llama_synchronize(self.ctx)

    def prefill(self, tokens: list[int]) -> None:
        for at in range(0, len(tokens), 512):
            self.decode(tokens[at : at + 512], at, all_logits=False)

    def row(self, i: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def trim(self, pos: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.mem, 0, pos, -1)

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)


def check_one(ctx: Ctx, tokens: list[int], p: int) -> dict[str, Any]:
    """Each k's rows against the one-position passes' rows of the same prefixes (after P)."""
    ctx.trim(0)
    ctx.prefill(tokens[:p])
    single = []
    for j in range(max(KS)):
        ctx.decode([tokens[p + j]], p + j)
        single.append(ctx.row(-1))
    out: dict[str, Any] = {}
    for k in KS:
        ctx.trim(p)
        ctx.decode(tokens[p : p + k], p)
        diffs = [float(np.abs(ctx.row(j) - single[j]).max()) for j in range(k)]
        same = all(np.array_equal(ctx.row(j), single[j]) for j in range(k))
        out[str(k)] = {"bit_equal": same, "max_logit_diff": max(diffs)}
    return out


def _said(r: dict[str, Any]) -> str:
    return "=" if r["bit_equal"] else f"{r['max_logit_diff']:.2g}"


def check(args: argparse.Namespace) -> None:
    for name in args.models.split(","):
        for fa in (f == "on" for f in args.flash_attn.split(",")):
            for extra in (True, False):
                ctx = Ctx(model_path(name), args.threads, fa, extra)
                tokens = ctx.tokens(TEXT)
                for p in (int(p) for p in args.prefixes.split(",")):
                    res = check_one(ctx, tokens, p)
                    flags = " ".join(f"k={k}:{_said(r)}" for k, r in res.items())
                    print(
                        f"{name:8} fa={'on ' if fa else 'off'} extra_bufts={'on ' if extra else 'off'} P={p:4}  {flags}"
                    )
                ctx.close()


def _ms(ctx: Ctx, tokens: list[int], pos: int) -> float:
    """The pass's CPU time on this thread (at 1 thread ggml computes on the caller: the work
    done, which the shared machine's other load barely moves; its wall time is what the load adds)."""
    t0 = time.thread_time()
    ctx.decode(tokens, pos)
    ms = (time.thread_time() - t0) * 1000
    ctx.trim(pos)
    return ms


def time_one(ctx: Ctx, tokens: list[int], repeats: int) -> dict[str, float]:
    """The prefill's tok/s (the prompt fresh each time, median of 3) and the median pass times."""
    prompt, rates = tokens[:700], []
    for _ in range(3):
        ctx.trim(0)
        t0 = time.thread_time()
        ctx.prefill(prompt)
        rates.append(len(prompt) / (time.thread_time() - t0))
    out = {"prefill_tok_s": statistics.median(rates)}
    times: dict[int, list[float]] = {k: [] for k in (1, 3, 5, 9)}
    for _ in range(repeats):  # the sizes interleaved: the machine's load falls on each alike
        for k in times:
            times[k].append(_ms(ctx, tokens[700 : 700 + k], 700))
    out.update({f"pass_{k}_ms": statistics.median(v) for k, v in times.items()})
    return out


def timing(args: argparse.Namespace) -> None:
    llamafile = "LLAMAFILE = 1" in llama_cpp.llama_print_system_info().decode()
    for name in args.models.split(","):
        for fa in (False, True):
            ctx = Ctx(model_path(name), args.threads, fa, True)
            tokens = ctx.tokens(TEXT)
            res = time_one(ctx, tokens, args.repeats)
            ctx.close()
            row = {"model": name, "flash_attn": fa, "llamafile": llamafile, "threads": args.threads, **res}
            row["load"] = os.getloadavg()[0]
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["check", "time"])
    ap.add_argument("--models", default="default,gemma")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--flash-attn", default="off,on", help="check: off, on or both")
    ap.add_argument("--prefixes", default="40,600", help="check: the prefixes' lengths P")
    args = ap.parse_args()
    llama_cpp.llama_log_set(_QUIET, None)
    print(llama_cpp.llama_print_system_info().decode().strip(), file=sys.stderr)
    (check if args.what == "check" else timing)(args)


if __name__ == "__main__":
    main()
