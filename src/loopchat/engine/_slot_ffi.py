"""The raw llama.cpp call of a shared run's prefill (shared_run.py), beside `_batch_ffi.py`'s.

A prompt that joins a running batch is evaluated into its own sequence: chunks of up to
n_batch tokens, each token of that one sequence at its own position, the logits kept for
the chunk's last token only (as Llama.eval does for sequence 0). Llama.eval itself cannot
be used there: it first drops every sequence's cells past its own n_tokens
(kv_cache_seq_rm(-1, ...)), the cells of the requests already running.
"""

from __future__ import annotations

from collections.abc import Sequence

import llama_cpp

from loopchat.engine._batch_ffi import LlamaBatch


class PrefillBatch:
    """One llama_batch of up to `size` tokens on one loaded `Llama`'s context; `close()` frees it."""

    def __init__(self, llm: llama_cpp.Llama, size: int) -> None:
        self._ctx = llm.ctx
        self.size = size
        self._batch: LlamaBatch | None = LlamaBatch(size)

    def decode(self, seq: int, tokens: Sequence[int], pos: int) -> int:
        """llama_decode of `tokens` (at most `size`) into sequence `seq` at positions pos,
        pos+1, ..., the logits of the last kept (llama_get_logits_ith(ctx, -1) reads them),
        waited for. Returns llama.cpp's code: 0 ok, 2 aborted, other values failures."""
        n = len(tokens)
        return self.decode_entries([(seq, token, pos + i, i == n - 1) for i, token in enumerate(tokens)])

    def decode_entries(self, entries: Sequence[tuple[int, int, int, bool]]) -> int:
        """llama_decode of (sequence, token, position, logits kept) entries (at most `size`:
        the prefills of several sequences in one batch), waited for; the logits of entry i
        are llama_get_logits_ith(ctx, i). Same return codes as `decode`."""
        assert self._batch is not None
        return self._batch.decode(self._ctx, entries)

    def close(self) -> None:
        if self._batch is not None:
            self._batch.free()
            self._batch = None
