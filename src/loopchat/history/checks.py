"""The history file looked at before it is opened for writing: read-only, outside the
writer's connection (header, schema version, PRAGMA quick_check), and the one-line
StoreErrors that say what to do with a file that cannot be used.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

from loopchat.errors import one_line
from loopchat.history.records import StoreError
from loopchat.history.schema import SCHEMA_VERSION

_SQLITE_MAGIC = b"SQLite format 3\x00"


def damaged(path: Path, why: str) -> StoreError:
    return StoreError(
        f"the history file {path} is damaged ({one_line(why)}): move it away to start a new one; "
        "loopchat runs with history off"
    )


def cannot_write(path: Path, why: str) -> StoreError:
    return StoreError(
        f"cannot write the history file {path} ({one_line(why)}): make its folder writable, or run with --no-history"
    )


def newer(path: Path, version: int) -> StoreError:
    return StoreError(
        f"the history file {path} was written by a newer loopchat (schema {version}; this one reads "
        f"up to {SCHEMA_VERSION}): upgrade loopchat, or move the file away to start a new one"
    )


def check_existing(path: Path, header: bool = True) -> int:
    """The schema version of an existing file, read without writing to it; StoreError
    for a damaged file or one from a newer loopchat. 0 for a missing or empty file.

    `header`: read the file's header first, outside SQLite. Never where this process may
    hold the file open through SQLite already: closing another descriptor of it drops the
    process's POSIX locks, and another process closing its last connection then takes the
    file for unused and deletes the WAL our connection still writes to."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise StoreError(f"cannot read the history file {path} ({exc.strerror})") from None
    if path.is_dir():
        raise StoreError(f"the history file {path} is a folder: move it away or use another path")
    if size == 0:
        return 0
    if header:
        try:
            with open(path, "rb") as f:
                head = f.read(100)
        except OSError as exc:
            raise StoreError(f"cannot read the history file {path} ({exc.strerror})") from None
        if len(head) < 100 or not head.startswith(_SQLITE_MAGIC):
            raise damaged(path, "not an SQLite database")
        page_size = int.from_bytes(head[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        pages = int.from_bytes(head[28:32], "big")
        wal = Path(str(path) + "-wal")
        wal_size = wal.stat().st_size if wal.exists() else 0
        if wal_size == 0 and pages and size < pages * page_size:
            raise damaged(path, f"truncated: {size} bytes of {pages * page_size}")
    try:
        ro = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read the history file {path} ({one_line(str(exc))})") from None
    try:
        version = ro.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise newer(path, version)
        problems = [row[0] for row in ro.execute("PRAGMA quick_check(5)")]
        if problems != ["ok"]:
            raise damaged(path, problems[0])
        if version == 0 and ro.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise StoreError(f"{path} is an SQLite file of another program: use another path for the history")
        return version
    except sqlite3.DatabaseError as exc:  # "file is not a database", "database disk image is malformed"
        if isinstance(exc, sqlite3.OperationalError) and "unable to open" in str(exc):
            raise StoreError(f"cannot read the history file {path} ({one_line(str(exc))})") from None
        raise damaged(path, str(exc)) from None
    finally:
        ro.close()
