"""Every raw llama.cpp call the engine makes, in one place, each with why it is used.

engine.py loads a model, tokenizes and prefills through llama-cpp-python's `Llama`; the
per-step forward pass, the logits, token pieces, the KV cache and cancellation go
through the calls below instead, for the reasons given at each. They are llama-cpp-python
0.3.36's low-level ctypes bindings (pinned exactly in pyproject.toml: that API changes
between 0.3.x releases) plus one binding of our own and one C function of libc.

Importing this module loads llama.cpp's shared library, so engine.py imports it only when
it loads a model (`import loopchat.engine.engine` stays light for the processes that only
build an EngineOptions). Engine logic stays in engine.py.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any

import llama_cpp
from llama_cpp import llama_cpp as _bindings

from loopchat.engine import pass_hook

# llama_get_logits_ith(ctx, i) -> float*: the logits of the i-th output of the last
# decode (-1: the last one). Bound again here to return a plain int address: llama-cpp-python's
# binding returns a POINTER(c_float) object, which (with the np.ctypeslib.as_array view
# made of it) left two reference cycles a step on the engine thread, garbage only the
# cycle collector frees. With an int the engine keeps one numpy view while the address
# stays the same.
_logits_ith = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(
    ("llama_get_logits_ith", _bindings._lib)
)


def _kernel_call(name: str) -> Callable[..., Any] | None:
    """The C kernel's function `name` (None: no kernel built, or one built before it)."""
    from loopchat.engine.sampler_fused import kernel

    return getattr(kernel, name, None) if kernel is not None else None


def address(fn: Any) -> int:
    """A ctypes pointer's or function's address as an int (0: null): what the kernel's calls by address take."""
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)


def _kernel_decode() -> Callable[[int, int, int], int] | None:
    """The C kernel's `decode` (engine/_sampler_kernel.c): the GIL let go, then a server's
    wake-up written, then llama_decode and llama_synchronize, in one call; given this
    library's two functions. None (no kernel built): the ctypes calls."""
    in_c, calls = _kernel_call("decode"), _kernel_call("llama_calls")
    if in_c is None or calls is None:
        return None
    calls(address(_bindings._lib.llama_decode), address(_bindings._lib.llama_synchronize))
    return in_c


_decode_in_c = _kernel_decode()


def decode(ctx: int, batch: llama_cpp.llama_batch) -> int:
    """llama_decode(ctx, batch), waited for (llama_synchronize): 0 ok, 2 aborted by the
    callback, other values failures. Where a server is attached (pass_hook.py) the kernel's
    call makes the pass, and the wake-up the server owes for the tokens the pass carries once
    it has let go of the GIL; elsewhere (the chat, `run`, a server without the kernel) the
    ctypes calls, the server's own write (if any) right before them."""
    in_c = _decode_in_c
    if in_c is None or not pass_hook.before_decode:
        pass_hook.call()
        rc = int(llama_cpp.llama_decode(ctx, batch))
        llama_cpp.llama_synchronize(ctx)
        return rc
    fd, lender = pass_hook.lend()
    try:
        return in_c(ctx, ctypes.addressof(batch), fd)
    finally:
        if lender is not None:
            lender.settle()


class AbortFlag:
    """A flag llama.cpp's abort callback reads from C without taking the GIL.

    ggml calls the abort callback once per graph node. A Python callback would take the
    GIL hundreds of times per forward pass and stall whenever a UI thread holds it, so
    the callback is libc's strlen() on a 2-byte buffer: it returns 0 (go on) while the
    buffer is empty and 1 (abort) once the first byte is set.
    """

    def __init__(self) -> None:
        self._buf = ctypes.create_string_buffer(2)
        self._py_callback = None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c"))
            address = ctypes.cast(libc.strlen, ctypes.c_void_p).value
            if address is None:
                raise OSError("libc's strlen has no address")
            # ggml_abort_callback: bool (*)(void * data), here pointing at strlen itself
            self.callback = llama_cpp.ggml_abort_callback(address)
        except (OSError, AttributeError):  # pragma: no cover - no libc strlen
            self._py_callback = llama_cpp.ggml_abort_callback(lambda _data: self.is_set())
            self.callback = self._py_callback

    @property
    def data(self) -> ctypes.c_void_p:
        return ctypes.cast(self._buf, ctypes.c_void_p)

    def set(self) -> None:
        self._buf[0] = b"\x01"

    def clear(self) -> None:
        self._buf[0] = b"\x00"

    def is_set(self) -> bool:
        return self._buf[0] != b"\x00"


class LlamaCalls:
    """The raw calls on one loaded `Llama`: create it after the load, call it from the
    thread that owns the Llama, and close it after closing the Llama."""

    def __init__(self, llm: llama_cpp.Llama) -> None:
        self._ctx = llm.ctx
        # llama_model_get_vocab: the vocabulary handle token_to_piece and is_eog take.
        self._vocab = llama_cpp.llama_model_get_vocab(llm.model)
        self._vocab_address, self._to_piece = address(self._vocab), address(_bindings._lib.llama_token_to_piece)
        self._piece_of = _kernel_call("piece_of") if self._vocab_address and self._to_piece else None
        # (the kernel's calls of llama_get_logits_ith and llama_vocab_is_eog, by address: ~10 us a token saved)
        self._ctx_address = address(self._ctx)
        self._logits_fn, self._eog_fn = address(_logits_ith), address(_bindings._lib.llama_vocab_is_eog)
        self._logits_at = _kernel_call("logits_at") if self._ctx_address and self._logits_fn else None
        self._eog_at = _kernel_call("is_eog_at") if self._vocab_address and self._eog_fn else None
        # llama_get_memory: the context's KV cache, for llama_memory_seq_rm below.
        self._memory = llama_cpp.llama_get_memory(llm.ctx)
        # llama_batch_init(1, 0, 1): a batch of one token at an explicit position, made
        # once and reused by every step (Llama.eval builds its batch and trims the
        # cache on every call, Python work between two forward passes). Freed in close().
        self._batch = llama_cpp.llama_batch_init(1, 0, 1)
        self._batch.n_tokens = 1
        self._batch.n_seq_id[0] = 1
        self._batch.seq_id[0][0] = 0  # sequence 0, the one Llama.eval uses
        self._batch.logits[0] = True
        self._token = self._batch.token
        self._synced = False  # the last decode_one waited for its pass (synchronize: nothing left)
        # a batch with logits for every position (decode_all), made on first use, grown as needed
        self._wide: llama_cpp.llama_batch | None = None
        self._wide_size = 0

    def set_abort_callback(self, flag: AbortFlag) -> None:
        """llama_set_abort_callback: ggml asks `flag` at every graph node whether to stop
        (Llama has no cancel of its own; this stops a long prefill mid-batch)."""
        llama_cpp.llama_set_abort_callback(self._ctx, flag.callback, flag.data)

    def decode_one(self, token: int, pos: int) -> int:
        """llama_decode of the one-token batch: `token` at position `pos`. Returns
        llama.cpp's code: 0 ok, 2 aborted by the callback, other values failures."""
        self._token[0] = token
        self._batch.pos[0] = pos
        self._synced = True
        return decode(self._ctx, self._batch)

    def synchronize(self) -> None:
        """llama_synchronize: wait until the last decode has finished (so the time
        measured is the forward pass's, and the logits are ready). A `decode_one` waited
        already (`decode`): its synchronize is not called again. (Were the flag left set by a
        decode_one no synchronize followed, when Llama.eval decodes next, skipping this call
        would change nothing: llama_get_logits_ith synchronizes before it returns a row.)"""
        if self._synced:
            self._synced = False
            return
        llama_cpp.llama_synchronize(self._ctx)

    def logits_address(self) -> int:
        """The address of the last output's n_vocab float logits (see `_logits_ith`),
        valid until the next decode. By the kernel's logits_at where it is built (the ctypes call's
        argument objects, libffi and GIL hand-off: 11 us median after a forward pass)."""
        if self._logits_at is not None:
            return self._logits_at(self._logits_fn, self._ctx_address, -1)
        return _logits_ith(self._ctx, -1)

    def token_to_piece(self, token_id: int) -> bytes:
        """llama_token_to_piece, special tokens spelled out: the token's exact bytes.
        llama-cpp-python's LlamaModel.token_to_piece returns its whole 32-byte buffer
        (NUL-padded); this keeps the length llama.cpp returns. The C kernel's `piece_of` makes
        the same call where it is built (ctypes' buffer and binding: ~15 us after a forward pass)."""
        if self._piece_of is not None:
            return self._piece_of(self._vocab_address, self._to_piece, token_id)
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, True)
        if n < 0:  # the piece needs -n bytes
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, True)
        return buf.raw[: max(n, 0)]

    def set_threads(self, n: int) -> None:
        """llama_set_n_threads: the thread count of the next forward passes, single-token
        and batch alike (`threads = "auto"` changes it between passes; see thread_tuner.py).
        Llama fixes both at load and has no setter."""
        llama_cpp.llama_set_n_threads(self._ctx, n, n)

    def is_eog(self, token_id: int) -> bool:
        """llama_vocab_is_eog: whether the token ends a reply (EOS, EOT, <|im_end|>...). By the
        kernel's is_eog_at where it is built (as logits_address)."""
        if self._eog_at is not None:
            return self._eog_at(self._eog_fn, self._vocab_address, token_id)
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token_id))

    def is_control(self, token_id: int) -> bool:
        """llama_vocab_is_control: a control token (<|im_start|>, <bos>...), which the
        chat template writes and no text tokenizes to by accident."""
        return bool(llama_cpp.llama_vocab_is_control(self._vocab, token_id))

    def forget_from(self, pos: int) -> None:
        """llama_memory_seq_rm: drop the KV cache's positions from `pos` on, of every
        sequence (the engine uses only sequence 0). The public call that Llama's private
        `_ctx.kv_cache_seq_rm` wraps."""
        llama_cpp.llama_memory_seq_rm(self._memory, -1, pos, -1)

    def decode_all(self, tokens: list[int], pos: int) -> int:
        """llama_decode of `tokens` at positions pos, pos+1, ... with the `logits` flag set
        for every one of them (prompt logprobs, prompt_scores.py): llama.cpp then keeps a
        row of logits per position, read with `logits_address(i)`. Llama.eval flags only
        the last position (or all of the context with logits_all, n_ctx x n_vocab floats):
        a batch of our own flags exactly the chunk. Same return codes as decode_one."""
        n = len(tokens)
        if self._wide is None or self._wide_size < n:
            if self._wide is not None:
                llama_cpp.llama_batch_free(self._wide)
            # llama_batch_init(n, 0, 1): token ids (not embeddings), one sequence id per token
            self._wide, self._wide_size = llama_cpp.llama_batch_init(n, 0, 1), n
        b = self._wide
        b.n_tokens = n
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = pos + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0  # sequence 0, as every other call here
            b.logits[i] = True  # int8 flag: keep this position's logits
        return decode(self._ctx, b)

    def logits_row_address(self, i: int) -> int:
        """The address of the n_vocab float logits of the i-th output of the last decode
        (outputs numbered in batch order among the flagged positions)."""
        if self._logits_at is not None:
            return self._logits_at(self._logits_fn, self._ctx_address, i)
        return _logits_ith(self._ctx, i)

    def close(self) -> None:
        """llama_batch_free of the one-token batch (and of the wide one, if made)."""
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._wide is not None:
            llama_cpp.llama_batch_free(self._wide)
            self._wide = None
