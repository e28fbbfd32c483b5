"""Parallel sequences (issue 25): N replies to one prompt, written in one batch.

A request with `n` > 1 (ReplyRequest.n) rolls the die N times: the prompt is evaluated once
and its KV cache shared by N sequences (llama_memory_seq_cp); then each forward pass decodes
one token of every sequence still going, in one llama_batch with logits for each, and each
sequence draws its next token from its own row with its own sampler state (its DRY and
penalty history, its own random stream: the reply's seed + the sequence's index). A sequence
that ends (an end token, max_tokens, a stop string) leaves the batch and its cells are
removed; the others go on.

The events: a `Start` per sequence (`sequence` 0..N-1, `sequences` N), one `Prefill` (shared:
`sequence` None), the steps of every sequence pass by pass (`Step.sequence`, and from the
second step on `Step.batch`: the batched pass that gave its logits), and a `Finish` per
sequence as it ends. `split_by_sequence` turns them into N ordinary replies' events. What a
pass costs against one sequence is measured in the same run (`BatchPass.single_ms`,
docs/trace-format.md, "Parallel sequences").
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

#: the most sequences one request may ask for (the context is made with one more: the run's
#: single-sequence probe, engine/batch_run.py)
SEQUENCES_MAX = 16
#: the sequence ids llama.cpp's context is made for (n_seq_max): the replies and the probe's
N_SEQ_MAX = SEQUENCES_MAX + 1
#: the chat's default number of replies (the N-replies key)
CHAT_N = 4


class BatchPass(NamedTuple):
    """One forward pass that decoded a token of several sequences at once; shared by the
    steps whose logits it gave."""

    number: int  # the batch's pass number: 1, 2, ... (0 would be the prefill, shared and not batched)
    size: int  # sequences in the batch (one token each)
    ms: float  # wall time of the batched llama_decode, waited for
    #: one sequence's pass at the same context length, measured in this run: the median of the latest
    #: three single-sequence probes (engine/batch_run.py: at passes 1, 2, 3 and every 64th); None: none yet
    single_ms: float | None


def batch_pass(value: Any) -> BatchPass:
    """A BatchPass from its JSON form (a list in field order, as `event_json` writes a NamedTuple)."""
    number, size, ms, single_ms = value
    return BatchPass(int(number), int(size), float(ms), None if single_ms is None else float(single_ms))


def check_n(n: object) -> int:
    """`n` as a number of sequences (ValueError, one line, when it is not one)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= SEQUENCES_MAX:
        raise ValueError(f"n must be a whole number from 1 to {SEQUENCES_MAX} (replies in one batch), got {n!r}")
    return n


def cells_needed(prompt_tokens: int, n: int, max_tokens: int) -> int:
    """KV-cache cells N replies of up to max_tokens need after a shared prompt (at most)."""
    return prompt_tokens + n * max_tokens


def fit_problem(prompt_tokens: int, n: int, max_tokens: int, n_ctx: int) -> str | None:
    """Why N replies do not fit the context (one line, what to do), or None: they fit."""
    need = cells_needed(prompt_tokens, n, max_tokens)
    if need <= n_ctx:
        return None
    room = n_ctx - prompt_tokens
    most_n = max(room // max_tokens, 0) if max_tokens > 0 else 0
    most_max = room // n if room > 0 else 0
    return (
        f"{n} replies of up to {max_tokens} tokens after a {prompt_tokens}-token prompt need {need} cells of the "
        f"KV cache and the context holds {n_ctx}: ask for n at most {most_n}, or max_tokens at most {most_max}"
    )


def split_by_sequence(events: Iterable[Any], n: int) -> list[list[Any]]:
    """A batch's events as N replies' events: each sequence's own, and the shared ones (a
    `sequence` of None: the Prefill, a ContextTrimmed) in every list."""
    out: list[list[Any]] = [[] for _ in range(n)]
    for event in events:
        seq = getattr(event, "sequence", None)
        if seq is None:
            for lst in out:
                lst.append(event)
        else:
            out[seq].append(event)
    return out


def pass_line(p: BatchPass) -> str:
    """The panel's and `run`'s line for a batched pass: '4 tokens in 14.8 ms · one sequence: 11.2 ms'."""
    single = "not measured yet" if p.single_ms is None else f"{p.single_ms:.1f} ms"
    tokens = "1 token" if p.size == 1 else f"{p.size} tokens"  # (the batch's last sequence alone)
    return f"{tokens} in {p.ms:.1f} ms · one sequence: {single}"


class BatchFigures(NamedTuple):
    """A batch's figures from its steps (`run -n`'s summary, the chat's info line)."""

    replies: int
    tokens: int  # steps of every reply (stop tokens included)
    span_ms: float  # from the first step of the batch to its last (elapsed_ms)
    tokens_per_s: float  # all replies together: (tokens - replies) / span (each reply's first token is the prefill's)
    pass_ms: float | None  # the median batched pass
    pass_size: float | None  # the median sequences in a pass
    single_ms: float | None  # the latest measured single-sequence pass (BatchPass.single_ms)


def batch_figures(steps: Sequence[Any]) -> BatchFigures:
    """The figures of a batch's steps (Steps with `sequence` and `batch`)."""
    passes = {s.batch.number: s.batch for s in steps if s.batch is not None}
    times = [s.elapsed_ms for s in steps]
    replies = len({s.sequence for s in steps})
    span = (max(times) - min(times)) if times else 0.0
    rate = (len(steps) - replies) / (span / 1000.0) if span > 0 else 0.0
    ordered = [passes[k] for k in sorted(passes)]
    singles = [p.single_ms for p in ordered if p.single_ms is not None]
    return BatchFigures(
        replies,
        len(steps),
        span,
        rate,
        statistics.median(p.ms for p in ordered) if ordered else None,
        statistics.median(p.size for p in ordered) if ordered else None,
        singles[-1] if singles else None,
    )


def figures_line(f: BatchFigures) -> str:
    """'4 replies · 96 tokens in 1.52 s: 60.5 tok/s together · a pass of 4: 14.8 ms (median) · one sequence: 11.2 ms'."""
    parts = [
        f"{f.replies} replies",
        f"{f.tokens} tokens in {f.span_ms / 1000:.2f} s: {f.tokens_per_s:.1f} tok/s together",
    ]
    if f.pass_ms is not None and f.pass_size is not None:
        parts.append(f"a pass of {f.pass_size:g}: {f.pass_ms:.1f} ms (median)")
    if f.single_ms is not None:
        parts.append(f"one sequence: {f.single_ms:.1f} ms")
        if f.pass_ms and f.pass_size:
            parts.append(f"{f.pass_size * f.single_ms / f.pass_ms:.2f}x the tokens of one sequence per ms")
    return " · ".join(parts)


__all__ = [
    "BatchFigures",
    "batch_figures",
    "figures_line",
    "CHAT_N",
    "N_SEQ_MAX",
    "SEQUENCES_MAX",
    "BatchPass",
    "batch_pass",
    "cells_needed",
    "check_n",
    "fit_problem",
    "pass_line",
    "split_by_sequence",
]
