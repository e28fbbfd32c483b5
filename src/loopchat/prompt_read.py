"""The prompt, as the model read it: the figures computed from a Prefill's prompt logprobs
(engine/prompt_scores.py), shared by `loopchat run --prompt-logprobs` and the document view.

A token's surprisal is -log2 of the probability the model gave it at its position (from
the logits of the position before it): `-Prefill.prompt_logprobs[i] / ln 2` bits. The
prompt's perplexity is 2 to the mean surprisal of its scored tokens (every token but the
first, which has nothing before it). docs/trace-format.md defines them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from loopchat.events import Prefill, Start

LN2 = math.log(2.0)

# what kind of text a prompt token is (the document view tells them apart)
SYSTEM, USER, TEMPLATE = "system", "user", "template"


def surprisals(prefill: Prefill | None) -> tuple[float | None, ...] | None:
    """Each prompt token's surprisal in bits (None: the first token, or not scored);
    None when the prefill carries no prompt logprobs."""
    if prefill is None or prefill.prompt_logprobs is None:
        return None
    return tuple(None if lp is None else -lp / LN2 for lp in prefill.prompt_logprobs)


@dataclass(frozen=True, slots=True)
class PromptSummary:
    scored: int  # tokens with a surprisal (all but the first)
    perplexity: float  # 2 ** (mean surprisal in bits)
    worst: int  # the position of the most surprising token
    worst_bits: float


def summary(bits: Sequence[float | None]) -> PromptSummary | None:
    """The prompt's perplexity and its most surprising token (None: nothing scored)."""
    scored = [(b, i) for i, b in enumerate(bits) if b is not None]
    if not scored:
        return None
    worst_bits, worst = max(scored, key=lambda s: (s[0], -s[1]))
    return PromptSummary(len(scored), 2.0 ** (sum(b for b, _ in scored) / len(scored)), worst, worst_bits)


def token_kinds(start: Start) -> tuple[str, ...]:
    """Each prompt token's kind: the template's own (its control tokens and the words around
    them: role names, newlines), the system prompt's, or the user's (every other message,
    a document's text included). A token is a message's when its text lies within that
    message's content as the prompt's token texts hold it (found in order)."""
    texts = start.prompt_token_texts
    if not texts:
        return ()
    joined = "".join(texts)  # the exact text read, BOS included
    spans: list[tuple[int, int, str]] = []
    at = 0
    for m in start.messages:
        if not m.content:
            continue
        found = joined.find(m.content, at)
        if found < 0:
            continue
        spans.append((found, found + len(m.content), SYSTEM if m.role == "system" else USER))
        at = found + len(m.content)
    special = set(start.prompt_special)
    kinds, offset, s = [], 0, 0
    for i, text in enumerate(texts):
        end = offset + len(text)
        while s < len(spans) and spans[s][1] <= offset:
            s += 1
        inside = s < len(spans) and spans[s][0] <= offset and end <= spans[s][1] and text
        kinds.append(spans[s][2] if inside and i not in special else TEMPLATE)
        offset = end
    return tuple(kinds)


def prompt_lines(start: Start, prefill: Prefill) -> list[str]:
    """`loopchat run --prompt-logprobs`: one line per prompt token (position, id, text,
    surprisal, the model's top guess there), then the prompt's perplexity."""
    bits = surprisals(prefill) or ()
    ids, texts, top = start.prompt_token_ids or (), start.prompt_token_texts, prefill.prompt_top or ()
    kinds = token_kinds(start)
    lines = []
    for i, b in enumerate(bits):
        text = repr(texts[i]) if i < len(texts) else "?"
        tid = ids[i] if i < len(ids) else "?"
        kind = kinds[i] if i < len(kinds) else ""
        if b is None:
            lines.append(f"{i:5d} {tid!s:>7} {text:<18} {'':>9}  {kind}")
            continue
        guess = f"top {top[i][0].text!r} {top[i][0].prob:.3f}" if i < len(top) and top[i] else ""
        lines.append(f"{i:5d} {tid!s:>7} {text:<18} {b:6.2f} bits  {kind:<8} {guess}")
    s = summary(bits)
    if s is not None:
        worst = repr(texts[s.worst]) if s.worst < len(texts) else f"position {s.worst}"
        lines.append(
            f"prompt: {len(bits)} tokens, perplexity {s.perplexity:.2f} over {s.scored}; "
            f"most surprising {worst} at {s.worst} ({s.worst_bits:.2f} bits)"
        )
    return lines
