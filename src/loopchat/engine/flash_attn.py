"""Flash attention in the engine's context: the setting handed to llama.cpp, and the value
llama.cpp resolved it to, read from its own log.

llama-cpp-python 0.3.36's `Llama(flash_attn=...)` is a bool (llama.cpp's ENABLED or
DISABLED) and creates the context inside its constructor, so "auto" (llama.cpp's
LLAMA_FLASH_ATTN_TYPE_AUTO) is set on the context params in the one call that creates the
context, `_internals.LlamaContext` (wrapped for the duration of one load, under a lock).

With "auto", llama.cpp decides when it reserves the compute graph (llama-context.cpp,
`resolve_fused_ops`) and says so in its log, "resolve_fused_ops: Flash Attention enabled"
or "... Flash Attention not supported, set to disabled"; it has no call that returns the
value. The context's own line "llama_context: flash_attn = auto|enabled|disabled" gives
what it was asked (after its own forced changes, e.g. a quantized V cache turns it on).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loopchat.batch import N_SEQ_MAX
from loopchat.flash_attn_setting import DEFAULT_FLASH_ATTN, FlashAttn
from loopchat.model_files import BUILTIN_MODELS

if TYPE_CHECKING:  # (llama_cpp is imported by the engine when it loads a model, not before: omp_spin.py)
    import llama_cpp

#: llama.cpp's enum llama_flash_attn_type for each setting (llama.h: LLAMA_FLASH_ATTN_TYPE_AUTO,
#: _DISABLED, _ENABLED; tests/test_flash_attn.py checks them against llama_cpp's)
FLASH_ATTN_TYPES: dict[str, int] = {"auto": -1, "off": 0, "on": 1}
_ASKED = re.compile(r"flash_attn\s+= (auto|enabled|disabled)")
_RESOLVED = re.compile(r"Flash Attention (enabled|not supported, set to disabled)")
_load_lock = threading.Lock()

#: the setting of a model file whose configuration does not say, measured per model
#: (docs/performance.md, "Flash attention"): flash attention costs the bundled SmolLM2-135M
#: 13-33% more per pass on a CPU (more as the context grows), so off; on Gemma 3 270M it
#: saves 9% and the default, auto, turns it on. Keyed by the GGUF file's name.
MEASURED: dict[str, FlashAttn] = {BUILTIN_MODELS["smollm2-135m-instruct"][1]: "off"}


def model_default(path: str | Path) -> FlashAttn:
    """The setting for a model file when neither models.toml nor the command line sets one."""
    return MEASURED.get(Path(path).name, DEFAULT_FLASH_ATTN)


@contextlib.contextmanager
def context_created_with(setting: FlashAttn) -> Iterator[None]:
    """While inside, a `Llama` created on this thread gets `setting` in its context params
    (one load at a time: the wrapper is llama-cpp-python's module attribute)."""
    from llama_cpp import _internals

    original = _internals.LlamaContext
    kind = FLASH_ATTN_TYPES[setting]

    def create(*, model: Any, params: llama_cpp.llama_context_params, verbose: bool = True) -> Any:
        params.flash_attn_type = kind  # the Llama's own context_params: it keeps what was asked
        # parallel sequences (batch.py, engine/batch_run.py): room for N_SEQ_MAX sequence ids in ONE
        # cache of n_ctx cells (unified: a prompt's cells shared by every sequence, not n_ctx / N each)
        params.n_seq_max, params.kv_unified = N_SEQ_MAX, True
        return original(model=model, params=params, verbose=verbose)

    with _load_lock:
        _internals.LlamaContext = create  # type: ignore[assignment,misc]
        try:
            yield
        finally:
            _internals.LlamaContext = original  # type: ignore[misc]


def resolved_from_log(log: str) -> str | None:
    """What llama.cpp's log of one context's creation says its flash attention is: "on" or
    "off" (None: the log does not say)."""
    asked = _ASKED.search(log)
    if asked is None:
        return None
    if asked.group(1) != "auto":
        return "on" if asked.group(1) == "enabled" else "off"
    resolved = _RESOLVED.search(log, asked.end())
    if resolved is None:
        return None
    return "on" if resolved.group(1) == "enabled" else "off"


__all__ = ["FLASH_ATTN_TYPES", "MEASURED", "context_created_with", "model_default", "resolved_from_log"]
