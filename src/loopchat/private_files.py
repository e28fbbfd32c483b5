"""Files only their owner may read, as shell history is: the conversations, llama.cpp's
log (it holds the prompts' text at high verbosity) and the exports.

- `private_dir(path)`: make a folder (and its missing parents) 0700; one that exists is
  left as it is (its owner may have opened it on purpose).
- `private_file(path)`: create a missing file 0600 (SQLite then gives its `-wal` and
  `-shm` files the same mode as the database).
- `tighten(path)`: a file others can read (a history file made by an older loopchat,
  0644) becomes 0600, with its `-wal`/`-shm`; returns the one-line notice to show, once
  (the next run finds it 0600 and says nothing).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TextIO

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
#: SQLite's files beside a database in WAL mode
SIDE_FILES = ("-wal", "-shm")


def private_dir(path: Path) -> Path:
    """Make `path` (and any missing parent) with mode 0700; OSError if it cannot be made."""
    path = Path(path)
    if not path.is_dir():
        path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    return path


def private_file(path: Path) -> Path:
    """Create `path` empty with mode 0600 if it is missing; never raises (whoever opens
    it next reports a problem)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))
    except OSError:
        pass
    return Path(path)


def open_private_append(path: Path) -> TextIO:
    """`open(path, "a")` for a file created 0600 (an existing one is tightened silently)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, PRIVATE_FILE)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, PRIVATE_FILE)
    except OSError:
        pass
    return os.fdopen(fd, "a", encoding="utf-8")


def tighten(path: Path) -> str | None:
    """Make `path` (and its SQLite side files) readable and writable by its owner only if
    others could read or write it. The notice to show once, or None (nothing to do, or it
    cannot be changed: not ours)."""
    path = Path(path)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None
    if not mode & 0o077:
        return None
    try:
        os.chmod(path, mode & 0o700)
        for side in SIDE_FILES:
            other = Path(str(path) + side)
            if other.exists():
                os.chmod(other, stat.S_IMODE(other.stat().st_mode) & 0o700)
    except OSError as exc:
        return f"{path} can be read by other users of this machine ({stat.filemode(stat.S_IFREG | mode)}) and could not be changed ({exc.strerror}): chmod 600 it"
    return f"{path} was readable by other users of this machine ({stat.filemode(stat.S_IFREG | mode)}): now {stat.filemode(stat.S_IFREG | mode & 0o700)}, yours only"
