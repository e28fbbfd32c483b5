"""Whether the process that began writing a reply is still running (store.py marks the
replies of a process that is gone as cut)."""

from __future__ import annotations


def process_started(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:  # AccessDenied...: it exists
        return -1.0


def writer_alive(pid: int | None, started: float | None) -> bool:
    """Whether the process that began a reply is still running (the same process: its pid
    and its start time, so a reused pid does not count)."""
    if pid is None:
        return False
    now_started = process_started(pid)
    if now_started is None:
        return False
    if now_started < 0 or started is None:
        return True
    return abs(now_started - started) < 1.0
