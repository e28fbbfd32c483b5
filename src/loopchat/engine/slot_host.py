"""One request's sequence in a shared run (shared_run.py), as its ReplyRun sees the model: `SlotHost`.

A `SequenceHost` (batch_run.py) with a prefill and a cache of its own. Sequence 0 is the
engine's own, the one a reply alone uses (Llama's `input_ids` and `n_tokens` say what its
cells hold): a request that finds nothing else running takes it and runs exactly as it
would alone, its prefill reusing what the last reply left in the cache. A request that
joins while others run takes a sequence 1..N of its own: its prefill goes into that
sequence (`PrefillBatch`, after the longest prefix it shares with sequence 0's cells,
copied by reference: llama_memory_seq_cp), its tokens listed here, its cells removed when
it ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from loopchat.engine.batch_run import SequenceHost
from loopchat.events import FinishReason


class SlotHost(SequenceHost):
    """Sequence `seq` of a shared run on `engine`: `calls` (BatchCalls) copy and remove its
    cells, `prefill` (PrefillBatch) evaluates its prompt; `cancelled` is its request's flag."""

    def __init__(
        self,
        engine: Any,
        seq: int,
        calls: Any,
        prefill: Any,
        cancelled: Callable[[], bool],
        faces: dict[int, tuple[str, bytes | None]] | None = None,
    ) -> None:
        super().__init__(engine, seq)
        #: each token's text and partial bytes, as run_die.RunDie.candidates finds them: one table for the
        #: model, shared by the batch's sequences (a reply's own table began empty: ~6 lookups a draw)
        self.faces = faces
        self.own = seq != 0  # False: the engine's own sequence (Llama's bookkeeping)
        self._calls, self._prefill, self._cancelled = calls, prefill, cancelled
        self.tokens: list[int] = []  # what this sequence's cells hold, in order (own sequences)
        #: a joint prefill (joint_prefill.py): `evaluate` queues its tokens here, from position
        #: `pending_from`, for one batch with the other joining requests' (own sequences)
        self.defer = False
        self.pending: list[int] = []
        self.pending_from = 0
        if self.own:
            self.pos = 0

    def cancelled(self) -> bool:
        return self._cancelled()

    # ---- the prefill (run.py's ReplyRun.prefill) ----
    def cached_tokens(self) -> np.ndarray:
        if not self.own:
            return self._engine.cached_tokens()
        return np.asarray(self.tokens, dtype=np.intc)

    def keep_cached(self, n: int) -> None:
        if not self.own:
            self._engine.keep_cached(n)
            return
        self._calls.remove(self.seq, n)
        del self.tokens[n:]
        self.pos = n

    def evaluate(self, tokens: Sequence[int]) -> None:
        if not self.own:
            self._engine.evaluate(tokens)
            return
        if self.defer:
            if not self.pending:
                self.pending_from = self.n_past
            self.pending.extend(tokens)
            self.tokens.extend(tokens)
            self.pos = self.n_past + len(tokens)
            return
        self._engine.passes += 1
        rc = self._prefill.decode(self.seq, tokens, self.n_past)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        self.tokens.extend(tokens)
        self.pos = self.n_past + len(tokens)
        self.row = None  # (the engine's last logits are this chunk's last token's)

    def decode_failure(self, exc: RuntimeError) -> tuple[FinishReason, str | None]:
        if not self.own:
            return self._engine.decode_failure(exc)
        self._calls.remove(self.seq, self.n_past)  # (part of an aborted chunk)
        if "returned 2" in str(exc):
            return FinishReason.CANCELLED, None
        return FinishReason.ERROR, f"llama.cpp failed to decode: {exc}"

    def share_prefix(self, prompt: Sequence[int]) -> None:
        """Before an own sequence's prefill: the longest prefix of `prompt` that sequence 0's
        cells hold becomes this sequence's too (no data copied); the prefill goes on after it."""
        cached = self._engine.cached_tokens()
        limit = min(len(cached), len(prompt) - 1)
        n = 0
        while n < limit and int(cached[n]) == prompt[n]:
            n += 1
        if self.own and n > 0 and not self.tokens:
            self._calls.copy(0, self.seq, n)
            self.tokens = list(prompt[:n])
            self.pos = n

    # ---- a batched pass and the end ----
    def took(self, token: int, row: np.ndarray) -> None:
        """A batched pass decoded `token` at this sequence's position: its logits are `row`."""
        if self.own:
            self.tokens.append(token)
            self.pos = self.n_past + 1
        else:  # Llama's bookkeeping, as Engine._decode_one keeps it
            llm = self._engine.llm
            llm.input_ids[llm.n_tokens] = token
            llm.n_tokens += 1
        self.row = row

    def rollback(self) -> None:
        """A batched pass failed: whatever it left of this sequence's token leaves the cache."""
        self._calls.remove(self.seq, self.n_past)

    def free(self) -> None:
        """The request ended: an own sequence's cells leave the cache (sequence 0 keeps them,
        as a reply alone leaves them, for the next prefill to reuse)."""
        if self.own:
            self._calls.remove(self.seq, 0)
            self.tokens.clear()
            self.pos = 0
        self.row = None
