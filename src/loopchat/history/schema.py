"""The history file's tables, and the migrations that bring an older file up to date.

`PRAGMA user_version` holds the schema version. Version 1 is kept here as it was
(V1_DDL), so a test can build a real v1 file and open it with the current code. Each
migration runs in one transaction: a file is at one version or the next, never between.

v1: conversations, nodes (the message tree: parent ids), reply_events (a reply's
    events after its Start: compact step batches, and its ContextTrimmed/Prefill).
v2: full-text search over message text and titles (two FTS5 tables kept in step by
    triggers), when the sqlite3 module has FTS5; without it the search is a LIKE scan.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

SCHEMA_VERSION = 2

#: The first schema, exactly as version 1 created it.
V1_DDL = """
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    model_name TEXT NOT NULL DEFAULT '',
    model_path TEXT NOT NULL DEFAULT '',
    model_size INTEGER NOT NULL DEFAULT 0,
    system_prompt TEXT,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE nodes (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id INTEGER REFERENCES nodes(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    -- a reply's: its delivery ('stream' | 'blocking'), status ('generating' | 'complete'
    -- | 'cut'), Start (zlib of its JSON), Finish (JSON), and the process writing it
    mode TEXT,
    status TEXT NOT NULL DEFAULT 'complete',
    start BLOB,
    finish TEXT,
    writer_pid INTEGER,
    writer_started REAL
);
CREATE INDEX nodes_by_conversation ON nodes(conversation_id, id);
CREATE INDEX nodes_by_parent ON nodes(parent_id);
CREATE INDEX nodes_generating ON nodes(status) WHERE status = 'generating';
CREATE TABLE reply_events (
    id INTEGER PRIMARY KEY,
    node_id INTEGER NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    -- 'steps': a batch of Steps (step_codec.py); 'json': one other event as JSON
    codec TEXT NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX reply_events_by_node ON reply_events(node_id, id);
"""

#: v2: the search index (FTS5). Rowids are the nodes' and the conversations' ids.
FTS_DDL = """
CREATE VIRTUAL TABLE node_text USING fts5(content, conversation_id UNINDEXED, tokenize = 'unicode61 remove_diacritics 2');
CREATE VIRTUAL TABLE title_text USING fts5(title, tokenize = 'unicode61 remove_diacritics 2');
CREATE TRIGGER node_text_ai AFTER INSERT ON nodes BEGIN
    INSERT INTO node_text(rowid, content, conversation_id) VALUES (new.id, new.content, new.conversation_id);
END;
CREATE TRIGGER node_text_au AFTER UPDATE OF content ON nodes BEGIN
    DELETE FROM node_text WHERE rowid = old.id;
    INSERT INTO node_text(rowid, content, conversation_id) VALUES (new.id, new.content, new.conversation_id);
END;
CREATE TRIGGER node_text_ad AFTER DELETE ON nodes BEGIN
    DELETE FROM node_text WHERE rowid = old.id;
END;
CREATE TRIGGER title_text_ai AFTER INSERT ON conversations BEGIN
    INSERT INTO title_text(rowid, title) VALUES (new.id, new.title);
END;
CREATE TRIGGER title_text_au AFTER UPDATE OF title ON conversations BEGIN
    DELETE FROM title_text WHERE rowid = old.id;
    INSERT INTO title_text(rowid, title) VALUES (new.id, new.title);
END;
CREATE TRIGGER title_text_ad AFTER DELETE ON conversations BEGIN
    DELETE FROM title_text WHERE rowid = old.id;
END;
INSERT INTO node_text(rowid, content, conversation_id) SELECT id, content, conversation_id FROM nodes;
INSERT INTO title_text(rowid, title) SELECT id, title FROM conversations;
"""


def fts5_available(conn: sqlite3.Connection) -> bool:
    """Whether this sqlite3 module was built with FTS5."""
    try:
        conn.execute("SELECT fts5(?1)", (None,)).fetchone()
    except sqlite3.OperationalError as exc:
        # "no such function: fts5" without it; with it, fts5() needs a pointer argument
        return "no such function" not in str(exc)
    return True  # pragma: no cover - fts5(NULL) returns an error in every build seen


def has_search_index(conn: sqlite3.Connection) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'node_text'").fetchone()
    return row is not None


def _v1_to_v2(conn: sqlite3.Connection) -> None:
    if fts5_available(conn):  # else the search scans with LIKE (ensure_search_index adds it later)
        _fts(conn)


#: MIGRATIONS[n] brings a file at version n to version n + 1.
MIGRATIONS = {1: _v1_to_v2}


def _run_in_transaction(
    conn: sqlite3.Connection, script_or_fn: str | Callable[[sqlite3.Connection], None], version: int
) -> None:
    """Run one step and set user_version, all in one transaction (the connection is in
    autocommit mode: isolation_level None)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if callable(script_or_fn):
            script_or_fn(conn)
        else:
            for statement in _statements(script_or_fn):
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {int(version)}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _statements(script: str) -> list[str]:
    """Split a DDL script into statements (a trigger's body keeps its inner ';')."""
    out: list[str] = []
    buf = ""
    for line in script.splitlines(keepends=True):
        if line.strip().startswith("--"):
            continue
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out


def create_v1(conn: sqlite3.Connection) -> None:
    """A new file at version 1 (then migrated like any v1 file; the tests build v1 files with it)."""
    _run_in_transaction(conn, V1_DDL, 1)


def migrate(conn: sqlite3.Connection, version: int) -> int:
    """Bring a file at `version` (0: new and empty) up to SCHEMA_VERSION; returns it."""
    if version == 0:
        create_v1(conn)
        version = 1
    while version < SCHEMA_VERSION:
        _run_in_transaction(conn, MIGRATIONS[version], version + 1)
        version += 1
    return version


def ensure_search_index(conn: sqlite3.Connection) -> bool:
    """A v2 file made where FTS5 was missing gets its index once FTS5 is there.
    Returns whether the index is in use."""
    if has_search_index(conn):
        return True
    if not fts5_available(conn):
        return False
    _run_in_transaction(conn, _fts, SCHEMA_VERSION)
    return True


def _fts(conn: sqlite3.Connection) -> None:
    for statement in _statements(FTS_DDL):
        conn.execute(statement)
