"""`echo` on the legacy completions (wire.py): the prompt sent back before the completion,
and with `logprobs` its tokens' entries, as OpenAI's completions API gave them.

The entries come from the Prefill's prompt logprobs (engine/prompt_scores.py: serve asks
for them when a request has echo and logprobs): each prompt token's text, its logprob
(the first token's: null, nothing comes before it), the top `logprobs` tokens at its
position with theirs (the first's: null), and its character offset in the prompt. A
leading control token the prompt does not spell (a BOS the tokenizer adds) is at
offset 0 and takes no characters.
"""

from __future__ import annotations

import math
from typing import Any

from loopchat.events import DOCUMENT, Prefill, Start


class PromptEcho:
    """The prompt of one completions request, from its Start."""

    def __init__(self, start: Start) -> None:
        doc = [m.content for m in start.messages if m.role == DOCUMENT]
        texts = start.prompt_token_texts
        self.text = doc[0] if doc else "".join(texts)
        self.tokens = texts
        self.offsets: list[int] = []
        at = 0
        for i, t in enumerate(texts):
            self.offsets.append(at)
            spelled = not (i == 0 and i in start.prompt_special and not self.text.startswith(t))
            at += len(t) if spelled else 0

    def legacy(self, prefill: Prefill, n: int) -> dict[str, list[Any]]:
        """The prompt's part of a legacy `logprobs` object (n: the top tokens per position)."""
        logprobs = prefill.prompt_logprobs or ()
        top_lists = prefill.prompt_top or ()
        token_logprobs: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        for i, token in enumerate(self.tokens):
            lp = logprobs[i] if i < len(logprobs) else None
            token_logprobs.append(lp)
            if lp is None:
                tops.append(None)
                continue
            top: dict[str, float] = {}
            for c in (top_lists[i] if i < len(top_lists) else ())[:n]:
                top.setdefault(c.text, _ln(c.prob))
            top.setdefault(token, lp)  # the prompt's own token is always there
            tops.append(top)
        return {
            "tokens": list(self.tokens),
            "token_logprobs": token_logprobs,
            "top_logprobs": tops,
            "text_offset": list(self.offsets),
        }


def _ln(p: float) -> float:
    return math.log(p) if p > 0 else -9999.0  # (wire.NO_LOGPROB: JSON has no -inf)
