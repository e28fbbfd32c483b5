"""The logit lens's raw llama.cpp and ggml calls, quarantined (issue 26, part 1).

A `LensContext` is a second llama.cpp context on the engine's loaded model (its weights
shared, a KV cache of its own) created with a graph callback (`cb_eval`): llama.cpp's
scheduler asks the callback, for each tensor of the forward pass's graph, whether it
wants to read it (ask=True), and then calls it again once the tensor is computed
(ask=False). The model graphs name each layer's output `l_out-<layer>` (src/models/*.cpp:
`cb(cur, "l_out", il)`); the lens takes the last row of each (the last position's hidden
state after that layer). The engine's own context never has the callback: with the lens
off nothing is set and nothing is paid.

The ggml_tensor struct is not bound by llama-cpp-python and is not read here field by
field: libggml-base (shipped in llama_cpp/lib) exports accessors, called on the tensor
pointer with ctypes, each commented with what it gives. Create, use and close a
LensContext on the engine's thread (the one that owns the Llama).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np

_GGML = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
# const char * ggml_get_name(const struct ggml_tensor * tensor): the tensor's name ("l_out-3")
_GGML.ggml_get_name.restype = ctypes.c_char_p
_GGML.ggml_get_name.argtypes = [ctypes.c_void_p]
# void * ggml_get_data(const struct ggml_tensor * tensor): its data (host memory on the CPU backend)
_GGML.ggml_get_data.restype = ctypes.c_void_p
_GGML.ggml_get_data.argtypes = [ctypes.c_void_p]
# int64_t ggml_nelements(const struct ggml_tensor * tensor): ne[0] * ne[1] * ne[2] * ne[3]
_GGML.ggml_nelements.restype = ctypes.c_int64
_GGML.ggml_nelements.argtypes = [ctypes.c_void_p]
# bool ggml_is_contiguous(const struct ggml_tensor * tensor): rows packed one after the other
_GGML.ggml_is_contiguous.restype = ctypes.c_bool
_GGML.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
# The one struct field read directly: struct ggml_tensor's first member is `enum ggml_type
# type` (ggml.h; a C enum, an int), GGML_TYPE_F32 = 0. ggml exports no getter for it.
_GGML_TYPE_F32 = 0
_LAYER = b"l_out-"


class LensContext:
    """A context with the lens's graph callback on the engine's model (`llm`: its Llama)."""

    def __init__(self, llm: llama_cpp.Llama, n_ctx: int, n_embd: int, threads: int) -> None:
        self.n_embd = n_embd
        self.capturing = False
        self.hidden: dict[int, np.ndarray] = {}  # layer -> the last position's hidden state
        self.problem: str | None = None
        # the callback object is kept on self: C holds only its address
        self._cb = llama_cpp.ggml_backend_sched_eval_callback(self._callback)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = 512
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = llm.context_params.flash_attn_type  # as the engine's: the same numbers
        params.cb_eval = self._cb
        params.cb_eval_user_data = None
        self._ctx = llama_cpp.llama_init_from_model(llm.model, params)
        if not self._ctx:
            raise RuntimeError("llama.cpp could not create the lens's context")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(512, 0, 1)
        self._cached: list[int] = []

    def _callback(self, tensor: int, ask: bool, _data: int) -> bool:
        if not self.capturing:
            return False
        name = _GGML.ggml_get_name(tensor) or b""
        if not name.startswith(_LAYER):
            return False
        if ask:
            return True
        n = int(_GGML.ggml_nelements(tensor))
        f32 = ctypes.c_int.from_address(tensor).value == _GGML_TYPE_F32
        if n % self.n_embd or not f32 or not _GGML.ggml_is_contiguous(tensor):
            self.problem = f"{name.decode()} is not float32 rows of {self.n_embd} values"
            return True
        # float32 rows of n_embd (the CPU backend's activations); the last row: the last position
        address = int(_GGML.ggml_get_data(tensor)) + (n - self.n_embd) * 4
        row = np.ctypeslib.as_array((ctypes.c_float * self.n_embd).from_address(address))
        self.hidden[int(name[len(_LAYER) :])] = np.array(row, dtype=np.float32)
        return True

    def capture(
        self, tokens: Sequence[int], singly_from: int | None = None
    ) -> tuple[dict[int, np.ndarray], np.ndarray]:
        """The hidden state after each layer at the last of `tokens`, and that position's
        logits (the model's own output), after the tokens cached. `singly_from`: the tokens
        from there on are evaluated one at a time, as the loop fed them (ggml's kernels
        round a batch's rows and a single row differently: the lens of a reply's pass
        re-read later is batched as the reply was: its prompt whole, its tokens singly)."""
        # only tokens appended to those cached are evaluated alone (a run's next pass); else
        # all again: dropping the end of a sequence is not exact on every cache (Gemma 3's
        # sliding-window cache gave other logits after llama_memory_seq_rm)
        n_common = len(self._cached)
        if not (0 < n_common < len(tokens) and list(tokens[:n_common]) == self._cached):
            llama_cpp.llama_memory_clear(self._memory, True)
            n_common = 0
        self._cached = list(tokens[:n_common])
        self.hidden, self.problem = {}, None
        single = len(tokens) if singly_from is None else max(singly_from, n_common)
        chunks = [list(tokens[i : min(i + 512, single)]) for i in range(n_common, single, 512)]
        chunks += [[t] for t in tokens[max(single, n_common) :]]
        for k, chunk in enumerate(chunks):
            self.capturing = k == len(chunks) - 1  # the last batch only: its last position
            try:
                self._decode(chunk, len(self._cached))
            finally:
                self.capturing = False
            self._cached += chunk
        address = llama_cpp.llama_get_logits_ith(self._ctx, -1)
        logits = np.ctypeslib.as_array(address, shape=(llama_cpp.llama_vocab_n_tokens(self._vocab()),)).copy()
        return self.hidden, logits

    def _vocab(self) -> llama_cpp.llama_vocab_p:
        return llama_cpp.llama_model_get_vocab(llama_cpp.llama_get_model(self._ctx))

    def _decode(self, tokens: list[int], pos: int) -> None:
        b = self._batch
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = t, pos + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = i == len(tokens) - 1
        rc = llama_cpp.llama_decode(self._ctx, b)
        if rc != 0:
            self._cached = []
            llama_cpp.llama_memory_clear(self._memory, True)
            raise RuntimeError(f"llama_decode returned {rc} (the lens's context)")

    def close(self) -> None:
        if self._ctx:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
