"""Where drafted tokens come from (speculative decoding, speculate.py): prompt lookup, a
draft model, and a request's predicted output. A drafter proposes up to k tokens to follow
the context; the verifying pass of the model (speculate.py) decides which of them the reply
keeps.

`LookupDrafter`: the longest n-gram (3, then 2 tokens) at the context's end that also
occurs earlier in the context proposes the tokens that followed it, as far as its latest
earlier occurrences (up to `LOOKUP_AGREE` of them) all agree on what followed: where they part
(a list's index that changes, a word that differs between two copies) the draft stops, as a
guess there would be refused as often as not. One occurrence: what followed it. Free (a numpy
search over the context), strong where the reply quotes, repeats or edits its prompt; nothing
found, or the occurrences part at once: no draft (the pass is a plain one).

`ModelDrafter`: a second GGUF with the same vocabulary (`open_draft_model` refuses another
one in one line: draft_model.py), decoding greedily on a context of its own, kept in step with the
target's: before each draft it keeps the longest prefix it shares with the target's
context and evaluates the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: the n-gram sizes prompt lookup tries, longest first (one token alone proposes too often
#: on free text, where what followed a word once rarely follows it again)
LOOKUP_NGRAMS = (3, 2)
#: the latest earlier occurrences whose continuations must agree for a drafted token (on the
#: benchmark's code rename, replayed with this machine's pass costs: 2 occurrences 1.17x the
#: plain loop, 4 1.20x, 8 1.18x, the latest alone 1.08x; docs/performance.md, twelfth session)
LOOKUP_AGREE = 4


class LookupDrafter:
    source = "lookup"

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrences (LOOKUP_AGREE at most)
        of the context's last n tokens (the longest n of LOOKUP_NGRAMS that occurs), as far as
        they all agree; [] when none occurs or they part at the first token."""
        if k <= 0 or len(context) < 2:
            return []
        arr = np.asarray(context, dtype=np.int64)
        n_ctx = arr.shape[0]
        for n in LOOKUP_NGRAMS:
            if n_ctx <= n:
                continue
            where = np.flatnonzero(_followed_starts(arr, arr[n_ctx - n :]))
            if where.size:
                return _agreed(arr, where[-LOOKUP_AGREE:] + n, k)
        return []

    def close(self) -> None:
        pass


def _followed_starts(arr: np.ndarray, gram: np.ndarray) -> np.ndarray:
    """For each start j of `arr` with something after j + len(gram): whether `gram` is there."""
    n, length = gram.shape[0], arr.shape[0]
    hits = arr[: length - n] == gram[0]
    for i in range(1, n):
        hits &= arr[i : length - n + i] == gram[i]
    return hits


def _agreed(arr: np.ndarray, starts: np.ndarray, k: int) -> list[int]:
    """Up to k tokens from the latest of `starts` on, as long as every start's continuation
    has the same token there (a continuation that runs into the context's end stops counting)."""
    latest = int(starts[-1])
    run = arr[latest : latest + k]
    for start in starts[:-1].tolist():
        other = arr[start : start + run.shape[0]]
        m = min(other.shape[0], run.shape[0])
        parted = np.flatnonzero(other[:m] != run[:m])
        if parted.size:
            run = run[: int(parted[0])]
    return run.tolist()


class PredictionDrafter:
    """OpenAI's Predicted Outputs (`prediction` on serve's chat endpoint): the text the reply is
    expected to be much like (a file with a few lines edited), as `tokens`. The context's last n
    tokens (3, then 2, then 1) are looked for in the prediction, their first occurrence that ends
    at or after the place the last draft came from, and what follows it there is proposed: while
    the reply follows the prediction each draft goes on from the last, and where the reply
    leaves it a few tokens later bring it back. Nothing found ahead: no draft."""

    source = "prediction"

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.at = 0  # the prediction's position after the tokens the last draft followed

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        p = self.tokens
        if k <= 0 or not context or p.shape[0] < 2:
            return []
        tail = np.asarray(context[-3:], dtype=np.int64)
        for n in (3, 2, 1):
            if tail.shape[0] < n or p.shape[0] <= n:
                continue
            hits = _followed_starts(p, tail[-n:])
            ahead = np.flatnonzero(hits[max(self.at - n, 0) :])  # (never back to a part already passed)
            if ahead.size:
                self.at = max(self.at - n, 0) + int(ahead[0]) + n
                return p[self.at : self.at + k].tolist()
        return []

    def close(self) -> None:
        pass


class ModelDrafter:
    """Greedy drafts from a draft model's own Engine (same vocabulary as the target's)."""

    source = "model"

    def __init__(self, engine: Any) -> None:
        self.engine = engine  # an Engine of the draft model

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """The draft model's k most likely tokens in turn (temperature 0) after `context`."""
        eng = self.engine
        if k <= 0 or not context or len(context) + k >= eng.n_ctx:
            return []
        cached = eng.cached_tokens()
        limit = min(len(cached), len(context) - 1)  # at least the last token evaluated: fresh logits
        same = np.asarray(cached[:limit]) == np.asarray(context[:limit], dtype=cached.dtype)
        n_common = limit if same.all() else int(np.argmin(same))
        eng.trim(n_common)
        rest = list(context[n_common:])
        for i in range(0, len(rest), eng.n_batch):
            eng.evaluate(rest[i : i + eng.n_batch])
        eng.sync()
        out: list[int] = []
        while True:
            token = int(np.argmax(eng.logits()))
            out.append(token)
            if len(out) == k or eng.is_eog(token):
                return out
            eng.forward(token)

    def close(self) -> None:
        self.engine.close()


def vocabulary_problem(target: Any, draft: Any) -> str | None:
    """How the two models' vocabularies differ (None: token for token the same bytes)."""
    if target.n_vocab != draft.n_vocab:
        return f"its vocabulary has {draft.n_vocab:,} tokens, the model's {target.n_vocab:,}"
    for i in range(target.n_vocab):
        if target.piece(i) != draft.piece(i):
            return f"token {i} is {draft.piece(i)!r} in it and {target.piece(i)!r} in the model"
    return None
