"""The `threads` setting's type: "auto" (the engine measures and chooses: engine/thread_tuner.py)
or a pinned whole number of threads. A contract: models.toml's reader, the command line's
--threads and the engine all take it from here."""

from __future__ import annotations

from typing import Literal

AUTO: Literal["auto"] = "auto"
Threads = int | Literal["auto"]


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


__all__ = ["AUTO", "Threads", "parse_threads"]
