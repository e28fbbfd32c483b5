"""Loading a GGUF file into llama-cpp-python's `Llama`, as the Engine does (engine.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loopchat.errors import ModelLoadError
from loopchat.flash_attn_setting import DEFAULT_FLASH_ATTN, FlashAttn
from loopchat.model_files import gguf_problem


def load_llama(
    path: Path,
    n_ctx: int,
    n_batch: int,
    threads: int,
    gpu_layers: int,
    log_path: Path | None,
    verbose: bool,
    flash_attn: FlashAttn = DEFAULT_FLASH_ATTN,
) -> Any:
    """The `Llama` for a GGUF file (ModelLoadError, one line, for a file it cannot load).

    `flash_attn` goes to llama.cpp's context params; afterwards `llm.context_params.flash_attn_type`
    holds what llama.cpp resolved it to (ENABLED or DISABLED, read from its log: flash_attn.py;
    AUTO only if the log did not say), so a second context on the model (the lens's) copies it.
    On Linux the file is read into 2 MB pages rather than mapped (huge_pages.py); `llm.huge_pages_mb`
    says how many MB of the load's memory are in them."""
    from llama_cpp import Llama

    from loopchat.engine import huge_pages
    from loopchat.engine.flash_attn import FLASH_ATTN_TYPES, context_created_with, resolved_from_log
    from loopchat.engine.llama_log import captured_log, python_prints_to_log, route_llama_log

    problem = gguf_problem(path)
    if problem is not None:
        raise ModelLoadError(f"{path} {problem}; point the model's `path` at a .gguf model file")
    log_path = route_llama_log(log_path, echo=verbose)  # None if the log cannot be written
    huge = huge_pages.wanted(path.stat().st_size)  # (the file read into 2 MB pages, not mapped)
    try:
        with (
            python_prints_to_log(),
            context_created_with(flash_attn),
            huge_pages.loading(huge) as pages,
            captured_log() as log,
        ):
            llm = Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                n_batch=n_batch,
                n_threads=threads,
                n_threads_batch=threads,
                n_gpu_layers=gpu_layers,  # ignored by a CPU-only build of llama.cpp
                logits_all=False,
                use_mmap=not huge,
                verbose=True,  # verbose=False dup2()s fds 1 and 2; our callback logs instead
            )
    except (ValueError, RuntimeError, OSError) as exc:
        where = f" (details in {log_path})" if log_path else ""
        raise ModelLoadError(
            f"llama.cpp could not load {path}: {str(exc).splitlines()[0]}{where}; "
            "check that it is a complete, uncorrupted GGUF file"
        ) from None
    llm.verbose = False  # no more prints from llama-cpp-python after the load
    llm.huge_pages_mb = pages[0]  # type: ignore[attr-defined]  # (the tests and benchmarks read it)
    resolved = resolved_from_log("".join(log))
    if resolved is not None:
        llm.context_params.flash_attn_type = FLASH_ATTN_TYPES[resolved]
    return llm
