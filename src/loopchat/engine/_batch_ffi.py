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


def decode_entries(ctx: Any, batch: Any, entries: Sequence[tuple[int, int, int, bool]]) -> int:
    """llama_decode of (sequence, token, position, logits kept) entries in `batch` (made by
    llama_batch_init with room for them all, one sequence id a token), waited for
    (llama_synchronize); the logits of entry i are llama_get_logits_ith(ctx, i). Returns
    llama.cpp's code: 0 ok, 2 aborted, other values failures."""
    batch.n_tokens = len(entries)
    for i, (seq, token, pos, keep) in enumerate(entries):
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = keep
    return decode(ctx, batch)


class BatchCalls:
    """The calls on one loaded `Llama`'s context, from the thread that owns it; `close()` frees the batch."""

    def __init__(self, llm: llama_cpp.Llama, n_vocab: int) -> None:
        self._ctx = llm.ctx
        self._memory = llama_cpp.llama_get_memory(llm.ctx)
        self._n_vocab = n_vocab
        # llama_batch_init(N_SEQ_MAX, 0, 1): token ids, one sequence id per token
        self._batch: Any = llama_cpp.llama_batch_init(N_SEQ_MAX, 0, 1)
        b = self._batch
        # the batch's arrays, each pointer read once (a field of the struct read makes a new
        # pointer object: five a token a pass otherwise); every entry keeps its logits
        self._token, self._pos, self._seq = b.token, b.pos, [b.seq_id[i] for i in range(N_SEQ_MAX)]
        for i in range(N_SEQ_MAX):
            b.n_seq_id[i], b.logits[i] = 1, True
        self._views: dict[int, np.ndarray] = {}  # a float view per logits row address, kept while it stays
        #: the rows of a pass of n, one view each, by (first row's address, n): see `rows`
        self._blocks: dict[tuple[int, int], list[np.ndarray]] = {}

    def decode(self, tokens: list[tuple[int, int, int]]) -> int:
        """llama_decode of (sequence, token, position) triples, each with its logits kept, waited
        for (llama_synchronize). Returns llama.cpp's code: 0 ok, 2 aborted, other values failures."""
        token, pos, seq_ids = self._token, self._pos, self._seq
        for i, (seq, tok, at) in enumerate(tokens):
            token[i], pos[i] = tok, at
            seq_ids[i][0] = seq
        self._batch.n_tokens = len(tokens)
        return decode(self._ctx, self._batch)

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
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
            self._views.clear()
            self._blocks.clear()
