"""The machine's physical core count: the most threads llama.cpp is given (auto threads)."""

from __future__ import annotations

import os


def physical_cores() -> int:
    """The machine's physical core count (llama-cpp-python's default is half the CPUs)."""
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except Exception:  # pragma: no cover - psutil is a dependency
        n = None
    try:
        available = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        available = os.cpu_count() or 1
    return max(1, min(n or available, available))
