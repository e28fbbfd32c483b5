"""The models `loopchat` can run, as data: `ModelSpec` (one model), `Config` (all of them
and the default), the built-in configuration, and ConfigError. models.toml's reader
(config_reader.py) makes them; config.py is the public face (`load_config`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from loopchat.constraint import Constraint, read_constraint
from loopchat.flash_attn_setting import FlashAttn
from loopchat.model_files import ModelFileError, builtin_model_path, check_gguf, hf_download
from loopchat.paths import default_config_path
from loopchat.settings import SamplingSettings
from loopchat.threads_setting import AUTO, Threads

#: The environment variable holding an API key: the remote server's for `--url`, or the one
#: `loopchat serve` requires (better than --api-key, which `ps` shows).
API_KEY_ENV = "LOOPCHAT_API_KEY"

SOURCES = ("path", "hf", "builtin", "url")
TIMEOUT_MAX = 86_400
N_CTX_MIN, N_CTX_MAX = 16, 1_048_576
THREADS_MAX = 1024
BUILTIN_NAME = "smollm2-135m-instruct"

#: how the chat opens a model (the `mode` key): messages through the chat template, or a
#: document the model continues as it is (completion mode, no template)
MODES = ("chat", "completion")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class ConfigError(Exception):
    """models.toml is unreadable or invalid, or a model name is unknown (one-line message)."""


@dataclass(frozen=True)
class ModelSpec:
    """One runnable model: where its GGUF file comes from and how to run it, or the
    server that runs it (source "url")."""

    name: str
    source: str  # "path" | "hf" | "builtin" | "url"
    location: str  # a file path, "org/repo:file.gguf", a built-in model name, or a server's URL
    n_ctx: int = 4096
    threads: Threads = AUTO  # "auto": the engine chooses from its own passes (thread_tuner.py)
    gpu_layers: int = 0  # layers llama.cpp offloads to a GPU (-1: all); needs a GPU build
    #: "auto" | "on" | "off"; None: the model's own default (engine/flash_attn.py, model_default)
    flash_attn: FlashAttn | None = None
    #: the draft model for speculative decoding: another entry's name or a GGUF path (None: none)
    draft: str | None = None
    chat_template: str | None = None  # Jinja2 override of the model's own template
    system_prompt: str | None = None  # None: no system message
    #: "chat" | "completion" | None: not set (chat, or completion for a model whose GGUF
    #: has no chat template and no chat_template here: chat_prompt.opening_mode)
    mode: str | None = None
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    description: str = ""
    base_dir: Path | None = None  # folder of the config file; relative paths start there
    from_command_line: bool = False  # a GGUF path given as --model, not a models.toml entry
    # a remote model (source "url"):
    model_id: str | None = None  # the server's name for it (None: the first of its GET /models)
    api_key: str | None = None
    api_key_env: str | None = None  # the environment variable that holds the key
    timeout: float | None = None  # seconds (None: backends.remote.DEFAULT_TIMEOUT)
    extensions: bool = True  # send top_k, min_p, repeat_penalty, repeat_last_n, dry_* too
    #: a grammar (GBNF or Lark) or a JSON schema file every reply of this model follows
    #: (issue 24; a relative path starts in the config file's folder); None: none
    grammar: str | None = None
    json_schema: str | None = None

    def constraint(self) -> Constraint | None:
        """The constraint models.toml gives this model's replies (ConstraintError: unreadable)."""
        kind, name = ("grammar", self.grammar) if self.grammar else ("json_schema", self.json_schema)
        if not name:
            return None
        path = Path(name).expanduser()
        return read_constraint(kind, path if path.is_absolute() or self.base_dir is None else self.base_dir / path)

    @property
    def remote(self) -> bool:
        return self.source == "url"

    def key(self) -> str | None:
        """The API key: `api_key`, or the variable `api_key_env` names (ConfigError if unset)."""
        if self.api_key_env is None:
            return self.api_key
        value = os.environ.get(self.api_key_env)
        if not value:
            where = f"models.toml model {self.name!r}" if self.base_dir else f"model {self.name!r}"
            raise ConfigError(
                f"{where} takes its API key from ${self.api_key_env}, which is not set — export it, "
                "e.g. `export " + self.api_key_env + "=...`"
            )
        return value

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"ModelSpec.source must be one of {', '.join(SOURCES)}, got {self.source!r}")

    def local_path(self) -> Path | None:
        """For source "path": the file it names (~ expanded, relative to base_dir)."""
        return self._named_file() if self.source == "path" else None

    def _named_file(self) -> Path:
        """The file `location` names (~ expanded, relative to base_dir)."""
        path = Path(self.location).expanduser()
        if not path.is_absolute() and self.base_dir is not None:
            path = self.base_dir / path
        return path

    def resolve_file(self, progress: bool = True) -> Path:
        """The checked GGUF file to load, downloading it first for an uncached hf model."""
        context = f"models.toml model {self.name!r}" if self.base_dir else f"model {self.name!r}"
        if self.remote:
            raise ModelFileError(f"{context} runs on a server ({self.location}), not from a file here")
        try:
            if self.source == "builtin":
                path = builtin_model_path(self.location)
            elif self.source == "hf":
                path = hf_download(self.location, progress=progress)
            else:
                path = self._named_file()
        except ModelFileError as exc:
            raise ModelFileError(f"{context}: {exc}") from None
        if self.from_command_line:
            check_gguf(path, named_by="--model")
        else:
            check_gguf(path, context=context)
        return path


@dataclass(frozen=True)
class Config:
    """All configured models, the default one, and the file they came from (None: built-in)."""

    default: str
    models: dict[str, ModelSpec]
    path: Path | None = None

    def draft_path(self, spec: ModelSpec) -> str | None:
        """The file of `spec`'s draft model (models.toml's `draft`: an entry's name or a path)."""
        if spec.draft is None:
            return None
        if spec.draft in self.models:
            return str(self.models[spec.draft].resolve_file(progress=False))
        path = Path(spec.draft).expanduser()
        return str(path if path.is_absolute() or spec.base_dir is None else spec.base_dir / path)

    def get(self, name: str | None = None) -> ModelSpec:
        """The named model (the default one for None); ConfigError if there is none."""
        name = self.default if name is None else name
        if name in self.models:
            return self.models[name]
        if looks_like_a_path(name):  # --model PATH.gguf: no models.toml entry needed
            return ModelSpec(
                name=name,
                source="path",
                location=name,
                description="a GGUF file given as --model",
                from_command_line=True,
            )
        where = display_path(self.path) if self.path else f"{display_path(default_config_path())} (create it)"
        raise ConfigError(
            f"unknown model {name!r} (known: {', '.join(self.models)}) — "
            f"add [{dotted_key('models', name)}] to {where}, or pick a known one"
        )


def looks_like_a_path(name: str) -> bool:
    """A --model value that names a file rather than a models.toml entry."""
    return name.lower().endswith(".gguf") or "/" in name or name.startswith("~")


#: What SmolLM2-135M-Instruct's own chat template puts in when a conversation has no system
#: message (the model was tuned with it); the rendered prompt is the same either way.
SMOLLM2_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
#: Its model card (huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct): temperature 0.2, top-p 0.9, top-k 50, no
#: min-p (issue 15: 19 of 25 simple first questions right, 15 with loopchat's general defaults); plus DRY 0.8 over 4096
#: tokens (its context) and a repeat penalty of 1.05 over 256 tokens: without, 19 of 36 replies said an 8-word phrase 3-58 times, with, none (docs/default-settings.md).
SMOLLM2_SAMPLING = SamplingSettings(
    temperature=0.2,
    top_p=0.9,
    top_k=50,
    min_p=0.0,
    repeat_penalty=1.05,
    repeat_last_n=256,
    dry_multiplier=0.8,
    dry_base=1.75,
    dry_allowed_length=2,
    dry_penalty_last_n=4096,
)

BUILTIN_CONFIG = Config(
    default=BUILTIN_NAME,
    models={
        BUILTIN_NAME: ModelSpec(
            name=BUILTIN_NAME,
            source="builtin",
            location=BUILTIN_NAME,
            n_ctx=4096,
            system_prompt=SMOLLM2_SYSTEM_PROMPT,
            sampling=SMOLLM2_SAMPLING,
            description="SmolLM2 135M Instruct, Q4_1 (bundled; tiny and fast, not very clever)",
        )
    },
    path=None,
)


def display_path(path: Path) -> str:
    """The path with the home folder shown as ~."""
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except ValueError:
        return str(path)


def dotted_key(prefix: str, key: str) -> str:
    part = key if _BARE_KEY.match(key) else '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{prefix}.{part}" if prefix else part
