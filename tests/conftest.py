"""Shared fixtures: the real default model, loaded once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loopchat.engine import Engine
from loopchat.model_files import builtin_model_path


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
def engine(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    log = tmp_path_factory.mktemp("log") / "llama.log"
    eng = Engine(model_path, n_ctx=2048, log_path=log)
    yield eng
    eng.close()
