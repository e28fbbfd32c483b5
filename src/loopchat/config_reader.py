"""models.toml's reader: parsed TOML in, a checked `Config` out, or a ConfigError whose one
line names the file, the dotted key, what is wrong and how to fix it. Also the chat
template check (a `chat_template` must compile as the engine will compile it).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from loopchat.errors import one_line
from loopchat.flash_attn_setting import FlashAttn, parse_flash_attn
from loopchat.model_files import BUILTIN_MODELS, ModelFileError, parse_hf_spec
from loopchat.model_spec import (
    BUILTIN_CONFIG,
    MODES,
    N_CTX_MAX,
    N_CTX_MIN,
    SOURCES,
    THREADS_MAX,
    TIMEOUT_MAX,
    Config,
    ConfigError,
    ModelSpec,
    display_path,
    dotted_key,
)
from loopchat.settings import SamplingSettings, SettingsError
from loopchat.threads_setting import AUTO, Threads
from loopchat.urls import URLProblem, api_base

#: what only a model run here has, and what only a remote model has
_LOCAL_KEYS = ("n_ctx", "threads", "gpu_layers", "chat_template", "flash_attn", "draft")
_REMOTE_KEYS = ("model", "api_key", "api_key_env", "timeout", "extensions")
_MODEL_KEYS = (
    *SOURCES,
    "description",
    *_LOCAL_KEYS,
    "system_prompt",
    "mode",
    "sampling",
    *_REMOTE_KEYS,
    "grammar",
    "json_schema",
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HF_EXAMPLE = 'hf = "Qwen/Qwen2.5-0.5B-Instruct-GGUF:qwen2.5-0.5b-instruct-q4_k_m.gguf"'


class Reader:
    """Turns parsed TOML into a Config, raising ConfigError at the first problem."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.shown = display_path(path)

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
                f"set default to one of them, or add [{dotted_key('models', default)}]",
            )
        return Config(default=default, models=models, path=self.path)

    def known_keys(self, table: dict[str, Any], prefix: str, allowed: tuple[str, ...], hint: str = "") -> None:
        for key in table:
            if key not in allowed:
                fix = hint or "check the spelling, or remove it"
                self.fail(dotted_key(prefix, key), f"is not a known key (allowed: {', '.join(allowed)})", fix)

    def model(self, name: str, raw: Any) -> ModelSpec:
        key = dotted_key("models", name)
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
            flash_attn=self.flash_attn(raw, key),
            draft=self.string(raw, key, "draft", None) or None,
            gpu_layers=self.integer(
                raw, key, "gpu_layers", 0, -1, 100_000, "layers to offload to a GPU: -1 for all, 0 for none"
            ),
            chat_template=template,
            system_prompt=self.string(raw, key, "system_prompt", None) or None,
            mode=self.mode(raw, key),
            sampling=self.sampling(raw.get("sampling", {}), f"{key}.sampling"),
            description=self.string(raw, key, "description", ""),
            base_dir=self.path.parent,
            **self.constraint_files(raw, key),
        )

    def constraint_files(self, raw: dict[str, Any], key: str) -> dict[str, Any]:
        """`grammar` / `json_schema`: a file every reply of the model follows (one of them)."""
        if "grammar" in raw and "json_schema" in raw:
            self.fail(key, "has both grammar and json_schema", "keep one: a reply follows one constraint")
        return {k: self.string(raw, key, k, None) or None for k in ("grammar", "json_schema")}

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
            **self.constraint_files(raw, key),
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

    def flash_attn(self, raw: dict[str, Any], key: str) -> FlashAttn | None:
        """`flash_attn`: "auto", true or false (None, not set: the model's own default)."""
        if "flash_attn" not in raw:
            return None
        try:
            return parse_flash_attn(raw["flash_attn"])
        except ValueError:
            self.fail(
                f"{key}.flash_attn",
                f'must be "auto", true or false, got {_kind(raw["flash_attn"])} {raw["flash_attn"]!r}',
                'e.g. flash_attn = "auto" (llama.cpp decides); edit the file',
            )
            raise

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


def chat_template_problem(template: str) -> str | None:
    """Why `template` does not compile as a chat template ("line 1: unexpected '}'"), or None.

    Compiled by llama-cpp-python's own Jinja2ChatFormatter (an ImmutableSandboxedEnvironment
    with its options and extensions), exactly as the engine will; it imports llama_cpp the
    first time (docs/performance.md, "Figures behind the code's choices", "Reading
    models.toml"), only for a config that sets a template. Errors that
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
