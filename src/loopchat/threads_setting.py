"""The `threads` setting's type: "auto" (the engine measures and chooses: engine/thread_tuner.py)
or a pinned whole number of threads. A contract: models.toml's reader, the command line's
--threads and the engine all take it from here."""

from __future__ import annotations

import os
from typing import Literal

from loopchat.errors import UsageError

AUTO: Literal["auto"] = "auto"
Threads = int | Literal["auto"]
#: the environment variable that stands for --threads when the option is not given (local models)
THREADS_ENV = "LOOPCHAT_THREADS"


def parse_threads(value: object) -> Threads:
    """`"auto"` or a whole number >= 1 (from the command line or models.toml)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == AUTO:
            return AUTO
        if text.isdigit() and int(text) >= 1:
            return int(text)
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError(f'must be "auto" or a whole number of threads from 1, got {value!r}')


def threads_or_env(given: Threads | None) -> Threads | None:
    """--threads as given, else LOOPCHAT_THREADS ("auto" or N; unset or empty: None, the
    model's own `threads`). A bad value is a UsageError that names the variable."""
    if given is not None:
        return given
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return None
    try:
        return parse_threads(text)
    except ValueError as exc:
        raise UsageError(f"{THREADS_ENV} {exc}: set it to auto or a number of threads, or unset it") from None


__all__ = ["AUTO", "THREADS_ENV", "Threads", "parse_threads", "threads_or_env"]
