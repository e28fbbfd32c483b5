"""The prompt, as the model read it: each prompt token's log-probability (issue 26, part 2).

A prefill feeds the prompt through the model in batches; by default llama.cpp keeps the
logits of the batch's last position only (the first step's). When a request asks for
prompt logprobs (`ReplyRequest.prompt_logprobs`), the prefill feeds the prompt through a
`ScoredFeed` instead of a `PlainFeed`: every position of a chunk keeps its row of logits
(`Engine.evaluate_scored`), and the row at position p gives token p+1's log-probability
(log-softmax of the raw logits, temperature 1, no sampler) and the model's top guesses
there. Token 0 has nothing before it: its logprob is None.

Chunks: a chunk's logits are chunk x n_vocab float32, so a chunk holds at most
`CHUNK_FLOATS // n_vocab` tokens (and at most n_batch): 170 tokens of the default model's
49,152-token vocabulary, 32 of Gemma's 262,144; never n_ctx x n_vocab at once.

The KV cache: a turn reuses the tokens the cache already holds. Their scores were computed
when they were fed, so the engine keeps them (`ScoreMemory`, one entry per cached
position, cut wherever the cache is cut); the first token evaluated now is scored from
the last reused position's logits, which are gone, so the feed reuses one token fewer
than the memory holds and recomputes it. Tokens the cache holds but the memory does not
(a reply's, fed back one by one) are evaluated again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from loopchat.events import Candidate

#: at most this many float32 logits (32 MB) in one chunk
CHUNK_FLOATS = 1 << 23


@dataclass(frozen=True, slots=True)
class TokenScore:
    """One prompt token: its natural-log probability given the tokens before it, and the
    model's top guesses at its position (ids and natural-log probabilities, best first)."""

    logprob: float
    top_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


class ScoreMemory:
    """The scores of the tokens the KV cache holds, by position (None: token 0, which has
    nothing before it). Entries past a cut of the cache are dropped by `keep`."""

    def __init__(self) -> None:
        self.scores: list[TokenScore | None] = []
        self.k = 0  # how many top guesses each entry holds

    def keep(self, n: int) -> None:
        del self.scores[n:]

    def clear(self) -> None:
        self.scores.clear()


def score_rows(rows: np.ndarray, following: Sequence[int], k: int) -> list[TokenScore]:
    """Each row of logits (n x n_vocab) scored against the token that follows it: its
    log-softmax at that token, and the k best tokens with theirs."""
    m = rows.max(axis=1, keepdims=True)
    lse = (m[:, 0].astype(np.float64)) + np.log(np.exp(rows - m).sum(axis=1, dtype=np.float64))
    out = []
    for i, t in enumerate(following):
        row = rows[i]
        top = np.argpartition(row, -k)[-k:] if k < row.size else np.arange(row.size)
        top = top[np.argsort(-row[top], kind="stable")]
        out.append(
            TokenScore(float(row[t] - lse[i]), tuple(int(j) for j in top), tuple(float(row[j] - lse[i]) for j in top))
        )
    return out


class ScoringHost(Protocol):
    n_batch: int
    n_vocab: int
    prompt_memory: ScoreMemory

    def evaluate(self, tokens: Sequence[int]) -> None: ...

    def evaluate_scored(self, tokens: Sequence[int]) -> np.ndarray: ...


class PlainFeed:
    """The prompt fed in n_batch batches, the last position's logits kept (the default)."""

    def __init__(self, host: ScoringHost) -> None:
        self.host = host
        self.chunk = host.n_batch

    def reuse(self, n_common: int) -> int:
        return n_common

    def evaluate(self, pos: int, tokens: Sequence[int]) -> None:
        self.host.evaluate(tokens)

    def fields(self) -> dict[str, Any]:
        return {}


class ScoredFeed(PlainFeed):
    """The prompt fed in chunks with every position's logits kept, each token scored."""

    def __init__(self, host: ScoringHost, tokens: Sequence[int], k: int, candidates: CandidateMaker) -> None:
        super().__init__(host)
        self.tokens, self.k, self.candidates = tokens, max(1, k), candidates
        self.chunk = max(1, min(host.n_batch, CHUNK_FLOATS // max(1, host.n_vocab)))
        self.memory = host.prompt_memory
        self._head: list[TokenScore | None] | None = None
        if self.memory.k < self.k:  # kept with fewer guesses than asked: recompute
            self.memory.clear()
            self.memory.k = self.k

    def reuse(self, n_common: int) -> int:
        """Reuse only tokens whose scores the memory holds, and recompute the last of them
        (the next token is scored from its logits): the scores of tokens 0..reuse, kept
        here while the host cuts the cache (and the memory) to the tokens before `reuse`.
        `reuse` < n_common: the token at n_common differs from the one the memory scored
        there (a prompt that parts from the cached one; its score was the other token's)."""
        n = max(0, min(n_common - 1, len(self.memory.scores) - 1))
        self._head = self.memory.scores[: n + 1] or [None]
        return n

    def evaluate(self, pos: int, tokens: Sequence[int]) -> None:
        memory = self.memory
        if self._head is not None:  # the first chunk: the scores of the tokens up to pos
            memory.scores[:] = self._head[: pos + 1]
            self._head = None
        rows = self.host.evaluate_scored(tokens)
        following = self.tokens[pos + 1 : pos + 1 + len(tokens)]
        memory.scores.extend(score_rows(rows[: len(following)], following, self.k))

    def fields(self) -> dict[str, Any]:
        """The Prefill's fields: each token's logprob and top guesses (the first token's:
        None and ()); only the k asked for of a memory that kept more."""
        logprobs: list[float | None] = []
        top: list[tuple[Candidate, ...]] = []
        for s in self.memory.scores[: len(self.tokens)]:
            logprobs.append(None if s is None else s.logprob)
            top.append(() if s is None else self.candidates(s.top_ids[: self.k], s.top_logprobs[: self.k]))
        return {"prompt_logprobs": tuple(logprobs), "prompt_top": tuple(top)}


CandidateMaker = Callable[[Sequence[int], Sequence[float]], tuple[Candidate, ...]]
