"""The figures of one finished reply, computed from its recorded events (no Textual):
what the compare screen (tui/compare_view.py) shows side by side.

Each figure is read from the events or computed from them, never estimated; one the
events do not carry (a remote server that is not loopchat sends no prefill, entropies
or forward times) is None: "not given".

A branch (a reply continued from the tokens of another) counts its own run: the steps of
its prefix were passes of the reply it continues.

Forward passes: the prefill's batches (one llama_decode call each) and one pass per
step after the first (step 0 samples from the prefill's logits; step i > 0 from the
pass over the token step i - 1 drew), as the engine counts them (`Engine.passes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from loopchat.events import DOCUMENT, Finish, Message, Prefill, Step


class Recorded(Protocol):
    """What a reply's record holds (tui/conversation.py ReplyRecord, a stored one alike)."""

    number: int
    messages: tuple[Message, ...]
    prefill: Prefill | None
    steps: list[Step]
    finish: Finish | None

    @property
    def own_steps(self) -> list[Step]:
        """The steps of its run (a branch's follow its prefix's, not run by it)."""
        ...

    @property
    def text(self) -> str: ...


@dataclass(frozen=True)
class ReplyStats:
    number: int  # the reply's number in the conversation
    question: str  # the first line of the message it answers
    passes: int | None  # forward passes: prefill batches + decode passes
    prompt_tokens: int | None
    evaluated_tokens: int | None  # of the prompt, run through the model (the rest came from the KV cache)
    reused_tokens: int | None
    prefill_ms: float | None
    ttft_ms: float | None  # from the request to the first token
    decode_ms: float | None  # from the first token to the last (Finish.decode_ms)
    tokens: int | None  # the reply's tokens (the stop token not counted)
    steps: int  # tokens sampled, the stop token included
    tokens_per_s: float | None  # decode rate (Finish.tokens_per_s)
    mean_entropy: float | None  # bits, of the raw distribution, over the steps
    mean_surprisal: float | None  # bits, -log2 of the drawn token's raw probability, over the steps
    finish: str  # the finish reason ("stop", "length", ...)
    text: str
    pass_ms: tuple[float, ...]  # each decode pass's forward time (steps 1..): per-pass latency
    entropies: tuple[float, ...]  # each step's raw entropy (bits)

    @property
    def decode_pass_ms(self) -> float | None:
        """The mean forward time of a decode pass."""
        return sum(self.pass_ms) / len(self.pass_ms) if self.pass_ms else None


def question_of(messages: Sequence[Message]) -> str:
    """The first line of the last user message (or of the document a raw run continues)."""
    for m in reversed(messages):
        if m.role in ("user", DOCUMENT):
            lines = m.content.strip().splitlines()
            return lines[0] if lines else ""
    return ""


def _all_given(values: list[float | None]) -> list[float] | None:
    if not values or any(v is None for v in values):
        return None
    return values  # type: ignore[return-value]


def reply_stats(rec: Recorded) -> ReplyStats:
    """The figures of a finished reply (`rec.finish` set)."""
    finish = rec.finish
    if finish is None:
        raise ValueError(f"reply {rec.number} has not finished")
    steps = rec.own_steps  # (a branch's prefix ran in the reply it continues)
    prefill = rec.prefill
    passes = prefill.batches + max(0, len(steps) - 1) if prefill is not None else None
    entropies = _all_given([s.raw_entropy for s in steps])
    probs = _all_given([s.raw_prob for s in steps])
    surprisal = None
    if probs is not None and all(p > 0 for p in probs):
        surprisal = sum(-math.log2(p) for p in probs) / len(probs)
    pass_ms = _all_given([s.forward_ms for s in steps[1:]])
    return ReplyStats(
        number=rec.number,
        question=question_of(rec.messages),
        passes=passes,
        prompt_tokens=prefill.prompt_tokens if prefill is not None else finish.prompt_tokens,
        evaluated_tokens=prefill.evaluated_tokens if prefill is not None else None,
        reused_tokens=prefill.reused_tokens if prefill is not None else None,
        prefill_ms=finish.prefill_ms,
        ttft_ms=finish.ttft_ms,
        decode_ms=finish.decode_ms,
        tokens=finish.completion_tokens,
        steps=len(steps),
        tokens_per_s=finish.tokens_per_s,
        mean_entropy=sum(entropies) / len(entropies) if entropies is not None else None,
        mean_surprisal=surprisal,
        finish=str(finish.reason.value),
        text=rec.text,
        pass_ms=tuple(pass_ms or ()),
        entropies=tuple(entropies or ()),
    )


R = TypeVar("R", bound=Recorded)


def comparable(replies: Sequence[R]) -> list[R]:
    """The replies that can be compared: those that finished (an error without a Finish,
    or the reply in flight, cannot)."""
    return [r for r in replies if r.finish is not None]


def ratio(a: float | None, b: float | None) -> float | None:
    """b / a, or None when either is not given or a is 0."""
    if a is None or b is None or a == 0:
        return None
    return b / a
