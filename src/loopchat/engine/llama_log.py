"""Route llama.cpp's own log output to a file instead of the terminal.

llama-cpp-python installs a callback that prints to stderr, and with verbose=False it
dup2()s file descriptors 1 and 2 to /dev/null while loading (which can swallow a running
TUI's screen). loopchat loads with verbose=True, swaps in this callback, and sends
llama-cpp-python's own Python-side prints to the same file.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import llama_cpp

from loopchat.private_files import open_private_append, private_dir

_lock = threading.Lock()


class _State:
    """Where the log goes (guarded by _lock)."""

    file: TextIO | None = None
    echo: bool = False
    captured: list[str] | None = None  # the lines kept meanwhile (captured_log)


_state = _State()


def _write(text: str) -> None:
    with _lock:
        if _state.captured is not None:
            _state.captured.append(text)
        f = _state.file
        if f is not None:
            try:
                f.write(text)
                f.flush()
            except (OSError, ValueError):
                pass
        if _state.echo and sys.__stderr__ is not None:
            sys.__stderr__.write(text)


@llama_cpp.llama_log_callback
def _callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    try:
        _write(text.decode("utf-8", errors="replace"))
    except Exception:  # never let an exception cross into C
        pass


#: At open, a log file larger than this is renamed to `<name>.1` (replacing the older
#: one) and a new one is started: the folder holds two files and one load's worth (a
#: load's size: docs/performance.md, "llama.cpp's log").
ROTATE_BYTES = 1_000_000


def rotate_log(path: Path, max_bytes: int = ROTATE_BYTES) -> None:
    """If `path` is over `max_bytes`, move it to `path` + ".1" (one old file is kept)."""
    try:
        if path.stat().st_size > max_bytes:
            path.replace(path.with_name(path.name + ".1"))
    except OSError:  # no file yet, or another loopchat rotated it first
        pass


def route_llama_log(path: Path | None, *, echo: bool = False) -> Path | None:
    """Send every later llama.cpp log line to `path` (appended; rotated first if it is
    over ROTATE_BYTES); echo to stderr if asked."""
    with _lock:
        old = _state.file
        if old is not None:
            with contextlib.suppress(OSError):
                old.close()
        _state.file = None
        if path is not None:
            try:
                private_dir(path.parent)  # 0700, the log 0600: it can hold prompts (private_files.py)
                rotate_log(path)
                _state.file = open_private_append(path)
            except OSError:
                path = None  # an unwritable log folder must not stop the model from loading
        _state.echo = echo
    llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))
    return path


class _Writer(io.StringIO):
    """A text stream for redirect_stderr/stdout that feeds the llama log (it keeps nothing)."""

    def write(self, text: str) -> int:
        _write(text)
        return len(text)

    def flush(self) -> None:
        pass


@contextlib.contextmanager
def python_prints_to_log() -> Iterator[TextIO]:
    """Send llama-cpp-python's print(..., file=sys.stderr) to the llama log meanwhile."""
    writer = _Writer()
    with contextlib.redirect_stderr(writer), contextlib.redirect_stdout(writer):
        yield writer


@contextlib.contextmanager
def captured_log() -> Iterator[list[str]]:
    """The llama.cpp log text written meanwhile (as well as to the file): what a load says
    that llama.cpp has no call for, such as the flash attention it resolved (flash_attn.py)."""
    kept: list[str] = []
    with _lock:
        _state.captured = kept
    try:
        yield kept
    finally:
        with _lock:
            _state.captured = None
