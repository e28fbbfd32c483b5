"""Shared fixtures: the real default model, loaded once per session; the path of the
second model (Gemma 3 270M, tests/gemma_model.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from gemma_model import gemma_path as _gemma_path

from loopchat.engine.engine import Engine
from loopchat.model_files import builtin_model_path

# A test run started in the background by a shell without job control (a script's `&`)
# inherits SIGINT ignored, and so would every process it starts: the Ctrl+C tests would
# send a signal nobody hears. A handler here gives the children SIGINT's default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def _isolated_dirs(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep tests away from the user's config, data and log folders."""
    base = tmp_path_factory.mktemp("loopchat-home")
    os.environ["LOOPCHAT_CONFIG_DIR"] = str(base / "config")
    os.environ["LOOPCHAT_DATA_DIR"] = str(base / "data")
    os.environ["LOOPCHAT_LOG_DIR"] = str(base / "log")


@pytest.fixture(scope="session")
def model_path() -> Path:
    return builtin_model_path()


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The assembled Gemma 3 270M file. Missing, the test fails (no skip: `make test`
    always assembles it, so a missing file is a broken set-up)."""
    try:
        return _gemma_path()
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def engine(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    log = tmp_path_factory.mktemp("log") / "llama.log"
    eng = Engine(model_path, n_ctx=2048, log_path=log)
    yield eng
    eng.close()
