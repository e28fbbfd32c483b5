"""The raw llama.cpp calls of parallel sequences (batch_run.py), beside `_llama_ffi.py`'s.

One `llama_batch` of up to N_SEQ_MAX tokens, each of its own sequence at its own position
with its logits kept; the KV cache's sequences copied (a prompt shared) and removed (a
sequence that ended). The context is made with `n_seq_max` = N_SEQ_MAX and a unified
cache (flash_attn.py's `context_created_with`): copying a sequence then marks the prompt's
cells as the other sequence's too, it copies no data.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy as np

from loopchat.batch import N_SEQ_MAX
from loopchat.engine._llama_ffi import _logits_ith, decode


class LlamaBatch:
    """One llama_batch of up to `size` tokens, one sequence id each (llama_batch_init(size, 0, 1)),
    its arrays' pointers read once (a field of the struct read makes a new pointer object: five a
    token a decode otherwise); `free()` frees it."""

    def __init__(self, size: int) -> None:
        self.raw: Any = llama_cpp.llama_batch_init(size, 0, 1)
        b = self.raw
        self._token, self._pos, self._logits = b.token, b.pos, b.logits
        self._seq = [b.seq_id[i] for i in range(size)]
        n_seq_id = b.n_seq_id
        for i in range(size):
            n_seq_id[i] = 1

    def decode(self, ctx: Any, entries: Sequence[tuple[int, int, int, bool]]) -> int:
        """llama_decode of (sequence, token, position, logits kept) entries (at most `size`),
        waited for (llama_synchronize); the logits of entry i are llama_get_logits_ith(ctx, i).
        Returns llama.cpp's code: 0 ok, 2 aborted, other values failures."""
        token, pos, logits, seq_ids = self._token, self._pos, self._logits, self._seq
        for i, (seq, tok, at, keep) in enumerate(entries):
            token[i], pos[i], logits[i] = tok, at, keep
            seq_ids[i][0] = seq
        self.raw.n_tokens = len(entries)
        return decode(ctx, self.raw)

    def free(self) -> None:
        llama_cpp.llama_batch_free(self.raw)


class BatchCalls:
    """The calls on one loaded `Llama`'s context, from the thread that owns it; `close()` frees the batch."""

    def __init__(self, llm: llama_cpp.Llama, n_vocab: int) -> None:
        self._ctx = llm.ctx
        self._memory = llama_cpp.llama_get_memory(llm.ctx)
        self._n_vocab = n_vocab
        self._batch: LlamaBatch | None = LlamaBatch(N_SEQ_MAX)
        self._views: dict[int, np.ndarray] = {}  # a float view per logits row address, kept while it stays
        #: the rows of a pass of n, one view each, by (first row's address, n): see `rows`
        self._blocks: dict[tuple[int, int], list[np.ndarray]] = {}

    def decode(self, tokens: list[tuple[int, int, int]]) -> int:
        """llama_decode of (sequence, token, position) triples, each with its logits kept, waited
        for (llama_synchronize). Returns llama.cpp's code: 0 ok, 2 aborted, other values failures."""
        assert self._batch is not None
        return self._batch.decode(self._ctx, [(seq, token, pos, True) for seq, token, pos in tokens])

    def rows(self, n: int) -> list[np.ndarray]:
        """The logits of the last `decode`'s n tokens, in its order: views of llama.cpp's buffer,
        valid until the next decode. llama.h's llama_get_logits: the rows of the tokens whose
        logits are kept lie contiguously in the order they appeared in the batch (all of them
        here), so one call finds them all (`row` makes one a token); the views are kept while
        the buffer stays where it is."""
        address = _logits_ith(self._ctx, 0)
        views = self._blocks.get((address, n))
        if views is None:
            floats: Any = (ctypes.c_float * (n * self._n_vocab)).from_address(address)
            block = np.frombuffer(floats, dtype=np.float32).reshape(n, self._n_vocab)
            views = self._blocks[(address, n)] = list(block)
        return views

    def row(self, i: int) -> np.ndarray:
        """The logits of the i-th token of the last decode: a view of llama.cpp's buffer, valid
        until the next decode (one view per address, kept: see engine.py's `logits`)."""
        address = _logits_ith(self._ctx, i)
        view = self._views.get(address)
        if view is None:
            floats: Any = (ctypes.c_float * self._n_vocab).from_address(address)
            view = self._views[address] = np.frombuffer(floats, dtype=np.float32)
        return view

    def copy(self, src: int, dst: int, end: int) -> None:
        """llama_memory_seq_cp: sequence `dst` holds `src`'s positions 0..end-1 too (-1: all)."""
        llama_cpp.llama_memory_seq_cp(self._memory, src, dst, 0, end)

    def remove(self, seq: int, start: int) -> None:
        """llama_memory_seq_rm: sequence `seq` no longer holds its positions from `start` on
        (a cell no sequence holds is free)."""
        llama_cpp.llama_memory_seq_rm(self._memory, seq, start, -1)

    def close(self) -> None:
        if self._batch is not None:
            self._batch.free()
            self._batch = None
            self._views.clear()
            self._blocks.clear()
