"""Where loopchat keeps its files (per-user, platform-appropriate, via platformdirs).

Nothing here creates a directory: whoever writes a file makes its folder first.
LOOPCHAT_CONFIG_DIR, LOOPCHAT_DATA_DIR, LOOPCHAT_LOG_DIR and LOOPCHAT_CACHE_DIR move
each folder elsewhere (the tests do).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "loopchat"
CONFIG_DIR_ENV = "LOOPCHAT_CONFIG_DIR"


def _dir(env: str, default: str) -> Path:
    override = os.environ.get(env)
    if override:
        return Path(override).expanduser()
    return Path(default)


def config_dir() -> Path:
    """The folder holding models.toml ($LOOPCHAT_CONFIG_DIR if set)."""
    return _dir(CONFIG_DIR_ENV, platformdirs.user_config_dir(APP_NAME, appauthor=False))


def default_config_path() -> Path:
    """The model configuration file read when none is given."""
    return config_dir() / "models.toml"


def log_dir() -> Path:
    return _dir("LOOPCHAT_LOG_DIR", platformdirs.user_log_dir(APP_NAME, appauthor=False))


def llama_log_path() -> Path:
    """Where llama.cpp's own log output is redirected."""
    return log_dir() / "llama.log"


def data_dir() -> Path:
    return _dir("LOOPCHAT_DATA_DIR", platformdirs.user_data_dir(APP_NAME, appauthor=False))


def cache_dir() -> Path:
    return _dir("LOOPCHAT_CACHE_DIR", platformdirs.user_cache_dir(APP_NAME, appauthor=False))
