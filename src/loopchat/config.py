"""The model configuration: which models `loopchat` can run, read from models.toml.

The file format is documented, field by field, in models.example.toml at the repository
root. A model is a GGUF file run here (`path`, `hf`, `builtin`) or a model on an
OpenAI-compatible server (`url`, backends/remote.py). Every ConfigError message is one line: the file, the dotted key, what is wrong and
how to fix it. With no file, the built-in configuration (one small bundled model) is used;
the built-in model stays available under its name even when a file exists.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopchat.engine.thread_tuner import AUTO, Threads
from loopchat.errors import one_line
from loopchat.model_files import (
    BUILTIN_MODELS,
    ModelFileError,
    builtin_model_path,
    check_gguf,
    gguf_problem,
    hf_cached_path,
    hf_download,
    parse_hf_spec,
)
from loopchat.paths import default_config_path
from loopchat.settings import SamplingSettings, SettingsError

#: The environment variable holding an API key: the remote server's for `--url`, or the one
#: `loopchat serve` requires (better than --api-key, which `ps` shows).
API_KEY_ENV = "LOOPCHAT_API_KEY"

SOURCES = ("path", "hf", "builtin", "url")
#: what only a model run here has, and what only a remote model has
_LOCAL_KEYS = ("n_ctx", "threads", "gpu_layers", "chat_template")
_REMOTE_KEYS = ("model", "api_key", "api_key_env", "timeout", "extensions")
TIMEOUT_MAX = 86_400
N_CTX_MIN, N_CTX_MAX = 16, 1_048_576
THREADS_MAX = 1024
BUILTIN_NAME = "smollm2-135m-instruct"

_MODEL_KEYS = (*SOURCES, "description", *_LOCAL_KEYS, "system_prompt", "mode", "sampling", *_REMOTE_KEYS)
#: how the chat opens a model (the `mode` key): messages through the chat template, or a
#: document the model continues as it is (completion mode, no template)
MODES = ("chat", "completion")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_HF_EXAMPLE = 'hf = "Qwen/Qwen2.5-0.5B-Instruct-GGUF:qwen2.5-0.5b-instruct-q4_k_m.gguf"'


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
        if self.source != "path":
            return None
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
                path = self.local_path()
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
        where = _display(self.path) if self.path else f"{_display(default_config_path())} (create it)"
        raise ConfigError(
            f"unknown model {name!r} (known: {', '.join(self.models)}) — "
            f"add [{_dotted('models', name)}] to {where}, or pick a known one"
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
    shown = _display(path)
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
    return _Reader(path).config(data)


# --- validation ------------------------------------------------------------------------


class _Reader:
    """Turns parsed TOML into a Config, raising ConfigError at the first problem."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.shown = _display(path)

    def fail(self, key: str, problem: str, fix: str = "edit the file or remove the key") -> None:
        raise ConfigError(one_line(f"{self.shown}: {key} {problem} — {fix}"))

    def config(self, data: dict[str, Any]) -> Config:
        self.known_keys(data, "", ("default", "models"))
        raw_models = data.get("models", {})
        if not isinstance(raw_models, dict):
            self.fail("models", f"must be a table, got {_kind(raw_models)}", "write each model as [models.NAME]")
        models = {name: self.model(name, raw) for name, raw in raw_models.items()}
        for name, spec in BUILTIN_CONFIG.models.items():
            models.setdefault(name, spec)

        default = data.get("default", next(iter(raw_models), BUILTIN_CONFIG.default))
        if not isinstance(default, str):
            self.fail(
                "default", f"must be a string (a model name), got {_kind(default)}", 'write e.g. default = "NAME"'
            )
        if default not in models:
            self.fail(
                "default",
                f"names model {default!r}, which is not defined (models: {', '.join(models)})",
                f"set default to one of them, or add [{_dotted('models', default)}]",
            )
        return Config(default=default, models=models, path=self.path)

    def known_keys(self, table: dict[str, Any], prefix: str, allowed: tuple[str, ...], hint: str = "") -> None:
        for key in table:
            if key not in allowed:
                fix = hint or "check the spelling, or remove it"
                self.fail(_dotted(prefix, key), f"is not a known key (allowed: {', '.join(allowed)})", fix)

    def model(self, name: str, raw: Any) -> ModelSpec:
        key = _dotted("models", name)
        if not _NAME.match(name):
            self.fail(key, "is not a usable model name", "use letters, digits, '.', '_' and '-' only")
        if not isinstance(raw, dict):
            self.fail(key, f"must be a table, got {_kind(raw)}", f"write it as [{key}] followed by its keys")
        stray = [k for k in raw if k in SamplingSettings.field_names()]
        self.known_keys(raw, key, _MODEL_KEYS, f"sampling settings go in [{key}.sampling]" if stray else "")

        sources = [s for s in SOURCES if s in raw]
        if len(sources) != 1:
            got = "none" if not sources else " and ".join(sources)
            fix = "keep only one of them" if sources else 'add one, e.g. path = "~/models/x.gguf"'
            self.fail(key, f"needs exactly one of path, hf, builtin, url (got {got})", fix)
        source = sources[0]
        location = self.string(raw, key, source, None, required=True)
        if source == "url":
            return self.remote_model(name, key, raw, location)
        for k in _REMOTE_KEYS:
            if k in raw:
                self.fail(f"{key}.{k}", "is only for a model on a server (url = ...)", "remove it")
        if source == "builtin" and location not in BUILTIN_MODELS:
            self.fail(
                f"{key}.builtin",
                f"names no built-in model: {location!r} (built-in: {', '.join(BUILTIN_MODELS)})",
                "use one of those, or path/hf for other models",
            )
        if source == "hf":
            try:
                parse_hf_spec(location)
            except ModelFileError:
                self.fail(f"{key}.hf", f'must look like "org/repo:file.gguf", got {location!r}', f"e.g. {_HF_EXAMPLE}")

        template = self.string(raw, key, "chat_template", None)
        if template is not None and not template.strip():
            self.fail(f"{key}.chat_template", "is empty", "remove the key to use the model's own template")
        if template is not None:
            problem = chat_template_problem(template)
            if problem is not None:
                self.fail(
                    f"{key}.chat_template",
                    f"is not a valid Jinja template ({problem})",
                    "fix the template, or remove the key to use the model's own",
                )
        return ModelSpec(
            name=name,
            source=source,
            location=location,
            n_ctx=self.integer(raw, key, "n_ctx", 4096, N_CTX_MIN, N_CTX_MAX, "the context window in tokens"),
            threads=self.threads(raw, key),
            gpu_layers=self.integer(
                raw, key, "gpu_layers", 0, -1, 100_000, "layers to offload to a GPU: -1 for all, 0 for none"
            ),
            chat_template=template,
            system_prompt=self.string(raw, key, "system_prompt", None) or None,
            mode=self.mode(raw, key),
            sampling=self.sampling(raw.get("sampling", {}), f"{key}.sampling"),
            description=self.string(raw, key, "description", ""),
            base_dir=self.path.parent,
        )

    def mode(self, raw: dict[str, Any], key: str) -> str | None:
        value = raw.get("mode")
        if value is None or value in MODES:
            return value
        self.fail(
            f"{key}.mode",
            f'must be "chat" or "completion", got {_kind(value)} {value!r}',
            'write mode = "chat" (messages through the chat template) or mode = "completion" (a document to continue)',
        )
        return None

    def remote_model(self, name: str, key: str, raw: dict[str, Any], url: str) -> ModelSpec:
        """A model on an OpenAI-compatible server: `url` and what a request needs."""
        from loopchat.backends.remote import URLProblem, api_base

        for k in _LOCAL_KEYS:
            if k in raw:
                self.fail(
                    f"{key}.{k}", "has no meaning for a model on a server (url = ...): the server sets it", "remove it"
                )
        try:
            api_base(url)
        except URLProblem as exc:
            self.fail(
                f"{key}.url",
                str(exc).split(";")[0].replace(f"{url!r} ", "", 1),
                'e.g. url = "http://127.0.0.1:8000/v1"',
            )
        if "api_key" in raw and "api_key_env" in raw:
            self.fail(key, "has both api_key and api_key_env", "keep one (api_key_env keeps the key out of this file)")
        env = self.string(raw, key, "api_key_env", None)
        if env is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", env):
            self.fail(
                f"{key}.api_key_env",
                f"must name an environment variable, got {env!r}",
                'e.g. api_key_env = "OPENAI_API_KEY"',
            )
        timeout = raw.get("timeout")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= TIMEOUT_MAX
        ):
            self.fail(
                f"{key}.timeout",
                f"must be a number of seconds above 0 and at most {TIMEOUT_MAX}, got {timeout!r}",
                "edit the file",
            )
        extensions = raw.get("extensions", True)
        if not isinstance(extensions, bool):
            self.fail(
                f"{key}.extensions", f"must be true or false, got {_kind(extensions)} {extensions!r}", "edit the file"
            )
        return ModelSpec(
            name=name,
            source="url",
            location=url,
            system_prompt=self.string(raw, key, "system_prompt", None) or None,
            mode=self.mode(raw, key),
            sampling=self.sampling(raw.get("sampling", {}), f"{key}.sampling"),
            description=self.string(raw, key, "description", ""),
            base_dir=self.path.parent,
            model_id=self.string(raw, key, "model", None, required=True) if "model" in raw else None,
            api_key=self.string(raw, key, "api_key", None) or None,
            api_key_env=env,
            timeout=float(timeout) if timeout is not None else None,
            extensions=extensions,
        )

    def string(self, raw: dict[str, Any], key: str, name: str, default: Any, required: bool = False) -> Any:
        if name not in raw:
            return default
        value = raw[name]
        if not isinstance(value, str):
            self.fail(f"{key}.{name}", f"must be a string, got {_kind(value)} {value!r}", "put the value in quotes")
        if required and not value.strip():
            self.fail(f"{key}.{name}", "is empty", "give a value")
        return value

    def integer(self, raw: dict[str, Any], key: str, name: str, default: Any, lo: int, hi: int, hint: str) -> Any:
        if name not in raw:
            return default
        value = raw[name]
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(
                f"{key}.{name}", f"must be a whole number, got {_kind(value)} {value!r}", f"{hint}; edit the file"
            )
        if not lo <= value <= hi:
            self.fail(f"{key}.{name}", f"must be between {lo} and {hi}, got {value}", f"{hint}; edit the file")
        return value

    def threads(self, raw: dict[str, Any], key: str) -> Threads:
        """`threads`: "auto" (the default) or a pinned whole number."""
        if raw.get("threads") == AUTO:
            return AUTO
        if isinstance(raw.get("threads"), str):
            self.fail(
                f"{key}.threads",
                f'must be "auto" or a whole number, got {raw["threads"]!r}',
                'e.g. threads = "auto"; edit the file',
            )
        hint = 'threads = "auto" (the default) lets loopchat choose'
        return self.integer(raw, key, "threads", AUTO, 1, THREADS_MAX, hint)

    def sampling(self, raw: Any, key: str) -> SamplingSettings:
        if not isinstance(raw, dict):
            self.fail(key, f"must be a table, got {_kind(raw)}", f"write it as [{key}] followed by its keys")
        self.known_keys(raw, key, SamplingSettings.field_names())
        settings = SamplingSettings()
        for name, value in raw.items():
            try:
                settings = settings.replace(**{name: value})
            except SettingsError as exc:
                self.fail(f"{key}.{name}", str(exc).removeprefix(f"{name} "))
        return settings


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
    if spec.source == "path":
        problem = gguf_problem(spec.local_path())
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
        head = f"config: (none: built-in defaults; create {_display(default_config_path())} to add models)"
    else:
        head = f"config: {_display(config.path)}"
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


# --- chat templates ----------------------------------------------------------------------


def chat_template_problem(template: str) -> str | None:
    """Why `template` does not compile as a chat template ("line 1: unexpected '}'"), or None.

    Compiled by llama-cpp-python's own Jinja2ChatFormatter (an ImmutableSandboxedEnvironment
    with its options and extensions), exactly as the engine will: a few ms, plus importing
    llama_cpp (~0.15 s) the first time, only for a config that sets a template. Errors that
    only show when rendering (an undefined filter on a branch taken later) are reported by
    the engine when it renders the prompt."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    try:
        Jinja2ChatFormatter(template=template, eos_token="", bos_token="")
    except Exception as exc:  # jinja2.TemplateSyntaxError, TemplateAssertionError, ...
        return template_error_text(exc)
    return None


def template_error_text(exc: Exception) -> str:
    """A jinja2 error as a few words on one line, with its line number when it has one."""
    lineno = getattr(exc, "lineno", None)
    message = one_line(str(getattr(exc, "message", None) or exc))
    return f"line {lineno}: {message}" if lineno else message


# --- helpers ------------------------------------------------------------------------------


def _display(path: Path) -> str:
    """The path with the home folder shown as ~."""
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except ValueError:
        return str(path)


def _dotted(prefix: str, key: str) -> str:
    part = key if _BARE_KEY.match(key) else '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{prefix}.{part}" if prefix else part


def _kind(value: Any) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        dict: "a table",
        list: "an array",
    }
    return names.get(type(value), "a date/time")
