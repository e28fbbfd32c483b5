"""The model configuration: which models `loopchat` can run, read from models.toml.

The file format is documented, field by field, in models.example.toml at the repository
root. A model is a GGUF file run here (`path`, `hf`, `builtin`) or a model on an
OpenAI-compatible server (`url`, backends/remote.py). Every ConfigError message is one
line: the file, the dotted key, what is wrong and how to fix it (config_reader.py). With
no file, the built-in configuration (one small bundled model) is used; the built-in model
stays available under its name even when a file exists. The models as data are in
model_spec.py; this module is the public face: read the file, list the models.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from loopchat.config_reader import Reader, chat_template_problem, template_error_text
from loopchat.errors import one_line
from loopchat.model_files import ModelFileError, builtin_model_path, gguf_problem, hf_cached_path
from loopchat.model_spec import (
    API_KEY_ENV,
    BUILTIN_CONFIG,
    BUILTIN_NAME,
    MODES,
    N_CTX_MAX,
    N_CTX_MIN,
    SMOLLM2_SAMPLING,
    SMOLLM2_SYSTEM_PROMPT,
    SOURCES,
    THREADS_MAX,
    TIMEOUT_MAX,
    Config,
    ConfigError,
    ModelSpec,
    display_path,
    looks_like_a_path,
)
from loopchat.paths import default_config_path


def load_config(path: Path | str | None = None) -> Config:
    """Read and validate a models.toml.

    None reads default_config_path(), and falls back to BUILTIN_CONFIG if that file does
    not exist; an explicitly given file must exist.
    """
    if path is None:
        path = default_config_path()
        if not path.exists():
            return BUILTIN_CONFIG
    path = Path(path).expanduser()
    shown = display_path(path)
    if not path.exists():
        raise ConfigError(f"{shown}: no such file — check the path, or copy models.example.toml there")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{shown}: is not UTF-8 text — save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(
            f"{shown}: cannot be read ({exc.strerror or exc}) — check that it is a readable file"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{shown}: invalid TOML: {one_line(str(exc))} — fix the syntax there") from None
    return Reader(path).config(data)


# --- `loopchat models` ------------------------------------------------------------------


def file_status(spec: ModelSpec) -> str:
    """Whether the model's file is on this machine (never downloads anything); a remote
    model: where its key comes from (the server is not contacted)."""
    if spec.remote:
        if spec.api_key_env:
            return "remote, key $" + spec.api_key_env + ("" if os.environ.get(spec.api_key_env) else " (not set)")
        return "remote, key in file" if spec.api_key else "remote, no key"
    if spec.source == "builtin":
        try:
            builtin_model_path(spec.location)
        except ModelFileError:
            return "not installed"
        return "installed"
    path = spec.local_path()  # None: the source is not "path"
    if path is not None:
        problem = gguf_problem(path)
        if problem is None:
            return "file present"
        return "file missing" if problem == "does not exist" else f"file {problem.split(' (')[0]}"
    try:
        return "cached" if hf_cached_path(spec.location) else "not downloaded"
    except ModelFileError:
        return "not downloaded (needs huggingface-hub)"


def format_models_listing(config: Config) -> str:
    """The text `loopchat models` prints: the config file in use and one line per model."""
    if config.path is None:
        head = f"config: (none: built-in defaults; create {display_path(default_config_path())} to add models)"
    else:
        head = f"config: {display_path(config.path)}"
    rows = [
        (
            ("* " if name == config.default else "  ") + name,
            f"{spec.source} {spec.location}" + (f" {spec.model_id}" if spec.model_id else ""),
            "" if spec.remote else f"n_ctx {spec.n_ctx}",
            file_status(spec),
            spec.description,
        )
        for name, spec in config.models.items()
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [head, ""]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[4]]
        lines.append("  " + "  ".join(cells).rstrip())
    lines += ["", "* = default model"]
    return "\n".join(lines)


__all__ = [
    "API_KEY_ENV",
    "BUILTIN_CONFIG",
    "BUILTIN_NAME",
    "MODES",
    "N_CTX_MAX",
    "N_CTX_MIN",
    "SMOLLM2_SAMPLING",
    "SMOLLM2_SYSTEM_PROMPT",
    "SOURCES",
    "THREADS_MAX",
    "TIMEOUT_MAX",
    "Config",
    "ConfigError",
    "ModelSpec",
    "chat_template_problem",
    "file_status",
    "format_models_listing",
    "load_config",
    "looks_like_a_path",
    "template_error_text",
]
