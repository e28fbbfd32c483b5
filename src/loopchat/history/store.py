"""The conversation store: one SQLite file (WAL mode) holding every conversation, its
message tree and every step of every reply.

Each write call is one transaction. A reply is written as it is generated: its row at
its Start (status "generating", with the writing process's pid and start time), its
step batches as they come, its Finish at the end ("complete"). A reply still
"generating" when its process is gone (killed) is marked "cut" by the next `open`; its
steps written before the kill stay, and `load` ends it with a made-up Finish.

A file that is damaged or from a newer loopchat is never written to: `open` reads it
read-only first (header, schema version, PRAGMA quick_check) and raises StoreError, one
line that says what to do. No Textual here (the CLI and the chat both use it).

This module opens the file and writes; beside it: records.py (what it holds and hands
out), checks.py (the file looked at before it is opened), reads.py (the queries).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from loopchat.event_json import to_json_dict
from loopchat.events import ContextTrimmed, Event, Finish, Prefill, Start, Step
from loopchat.history import reads, schema
from loopchat.history.checks import cannot_write, check_existing, damaged, newer
from loopchat.history.liveness import process_started, writer_alive
from loopchat.history.reads import search_like
from loopchat.history.records import (
    CUT,
    ConversationSummary,
    StoredConversation,
    StoredNode,
    StoreError,
    default_store_path,
)
from loopchat.history.schema import SCHEMA_VERSION
from loopchat.history.step_codec import encode_steps
from loopchat.private_files import private_dir, private_file, tighten

__all__ = [
    "SCHEMA_VERSION",
    "CUT",
    "ConversationStore",
    "ConversationSummary",
    "StoreError",
    "StoredConversation",
    "StoredNode",
    "default_store_path",
    "search_like",
]


def _start_blob(start: Start) -> bytes:
    return zlib.compress(json.dumps(to_json_dict(start), ensure_ascii=False).encode("utf-8"), 6)


class ConversationStore:
    def __init__(self, path: Path, conn: sqlite3.Connection, search_index: bool) -> None:
        self.path = path
        self._conn = conn
        self._fts = search_index
        self.notice: str | None = None  # `open` made the file private: the line to show (once)

    # ---- opening ---------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: Path | str | None = None) -> ConversationStore:
        """Open or create (WAL mode). StoreError for a damaged file, a newer schema, a folder that
        cannot be written...; a damaged or newer file is never written to. Marks replies left
        "generating" by a process that died as "cut"."""
        path = Path(path).expanduser() if path is not None else default_store_path()
        try:
            private_dir(path.parent)  # 0700, the history file 0600 (private_files.py)
        except OSError as exc:
            raise cannot_write(path, f"cannot create {path.parent}: {exc.strerror}") from None
        for target in (path.parent, path):  # WAL mode writes files beside it: the folder too
            if target.exists() and not os.access(target, os.W_OK):
                raise cannot_write(path, f"{target} is read-only")
        check_existing(path)
        try:
            conn = sqlite3.connect(str(private_file(path)), timeout=10, isolation_level=None)
        except sqlite3.Error as exc:
            raise cannot_write(path, str(exc)) from None
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise cannot_write(path, f"journal mode {mode}, not WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            # the version again, under the write lock: another process may have created it meanwhile
            conn.execute("BEGIN IMMEDIATE")
            try:
                current = conn.execute("PRAGMA user_version").fetchone()[0]
                if current > SCHEMA_VERSION:
                    raise newer(path, current)
                conn.execute(f"PRAGMA user_version = {int(current)}")  # a write: a read-only file fails here
            finally:
                conn.execute("ROLLBACK")  # nothing to keep: it was only a probe
            schema.migrate(conn, current)
            store = cls(path, conn, schema.ensure_search_index(conn))
            store.notice = tighten(path)  # a file others could read (an older loopchat's): 0600, said once
            store._mark_cut()
            return store
        except StoreError:
            conn.close()
            raise
        except sqlite3.DatabaseError as exc:
            conn.close()
            text = str(exc)
            if "readonly" in text or "read-only" in text or "unable to open" in text or "disk" in text:
                raise cannot_write(path, text) from None
            raise damaged(path, text) from None

    @classmethod
    def open_reader(cls, path: Path | str | None = None) -> ConversationStore:
        """A read-only connection, for reading on a thread that must not write (the chat's
        conversation list, on the UI thread): no lock, no migration, no marking of cut
        replies (the writer's own `open` did those). StoreError as `open`, and for a file
        not yet migrated to this version."""
        path = Path(path).expanduser() if path is not None else default_store_path()
        version = check_existing(path, header=False)  # the chat's writer holds it open
        if version == 0:
            raise StoreError(f"no conversation is stored yet ({path})")
        if version > SCHEMA_VERSION:
            raise newer(path, version)
        if version < SCHEMA_VERSION:
            raise StoreError(
                f"the history file {path} is from an older loopchat: open the chat with history on once to update it"
            )
        try:
            conn = sqlite3.connect(
                f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=10, isolation_level=None
            )
            conn.execute("PRAGMA query_only = ON")
            return cls(path, conn, schema.has_search_index(conn))
        except sqlite3.DatabaseError as exc:
            raise damaged(path, str(exc)) from None

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ConversationStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _mark_cut(self) -> None:
        rows = self._conn.execute(
            "SELECT id, writer_pid, writer_started FROM nodes WHERE status = 'generating'"
        ).fetchall()
        for node_id, pid, started in rows:
            if not writer_alive(pid, started):
                self.mark_cut(node_id)

    def mark_cut(self, node_id: int) -> None:
        """A reply that will never finish (its writer died; a trace cut short): "cut", its
        text the steps' so far. `load` gives it a made-up Finish (error CUT)."""
        events = reads.reply_events(self._conn, self.path, node_id, "cut")
        text = events[-1].text if events and isinstance(events[-1], Finish) else ""
        with self._tx() as c:
            c.execute(
                "UPDATE nodes SET status = 'cut', content = ?, writer_pid = NULL WHERE id = ? AND status = 'generating'",
                (text, node_id),
            )

    # ---- writing -----------------------------------------------------------------------------------
    def new_conversation(
        self,
        title: str,
        model_name: str,
        model_path: str = "",
        model_size: int = 0,
        system_prompt: str | None = None,
    ) -> int:
        now = time.time()
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO conversations (title, model_name, model_path, model_size, system_prompt, created, updated)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (title, model_name, model_path or "", int(model_size or 0), system_prompt, now, now),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    def _insert_node(
        self,
        c: sqlite3.Connection,
        conversation_id: int,
        parent_id: int | None,
        role: str,
        content: str,
        **extra: object,
    ) -> int:
        now = time.time()
        if c.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone() is None:
            raise KeyError(f"no conversation {conversation_id}")
        if parent_id is not None:
            row = c.execute("SELECT conversation_id FROM nodes WHERE id = ?", (parent_id,)).fetchone()
            if row is None or row[0] != conversation_id:
                raise KeyError(f"no message {parent_id} in conversation {conversation_id}")
        cols = ["conversation_id", "parent_id", "role", "content", "created", *extra]
        cur = c.execute(
            f"INSERT INTO nodes ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
            (conversation_id, parent_id, role, content, now, *extra.values()),
        )
        c.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def add_message(self, conversation_id: int, parent_id: int | None, role: str, content: str) -> int:
        with self._tx() as c:
            return self._insert_node(c, conversation_id, parent_id, role, content)

    def begin_reply(self, conversation_id: int, parent_id: int | None, mode: str, start: Start) -> int:
        pid = os.getpid()
        blob = _start_blob(start)
        with self._tx() as c:
            return self._insert_node(
                c,
                conversation_id,
                parent_id,
                "assistant",
                "",
                mode=mode,
                status="generating",
                start=blob,
                writer_pid=pid,
                writer_started=process_started(pid),
            )

    def add_events(self, node_id: int, events: Sequence[Event]) -> None:
        """A reply's ContextTrimmed / Prefill / Steps, in order, in one transaction: each
        run of Steps as one compact batch. A Finish among them finishes the reply."""
        rows: list[tuple[str, bytes]] = []
        run: list[Step] = []
        finish: Finish | None = None
        for ev in events:
            if isinstance(ev, Step):
                run.append(ev)
                continue
            if run:
                rows.append(("steps", encode_steps(run)))
                run = []
            if isinstance(ev, (ContextTrimmed, Prefill)):
                rows.append(("json", json.dumps(to_json_dict(ev)).encode("utf-8")))
            elif isinstance(ev, Finish):
                finish = ev
            else:
                raise ValueError(f"add_events takes a reply's events after its Start, not {type(ev).__name__}")
        if run:
            rows.append(("steps", encode_steps(run)))
        with self._tx() as c:
            if rows:
                c.executemany(
                    "INSERT INTO reply_events (node_id, codec, data) VALUES (?, ?, ?)",
                    [(node_id, codec, data) for codec, data in rows],
                )
            if finish is not None:
                self._finish(c, node_id, finish)

    def _finish(self, c: sqlite3.Connection, node_id: int, finish: Finish) -> None:
        now = time.time()
        cur = c.execute(
            "UPDATE nodes SET status = 'complete', content = ?, finish = ?, writer_pid = NULL"
            " WHERE id = ? AND role = 'assistant'",
            (finish.text, json.dumps(to_json_dict(finish), ensure_ascii=False), node_id),
        )
        if cur.rowcount != 1:
            raise KeyError(f"no reply {node_id}")
        c.execute(
            "UPDATE conversations SET updated = ? WHERE id = (SELECT conversation_id FROM nodes WHERE id = ?)",
            (now, node_id),
        )

    def finish_reply(self, node_id: int, finish: Finish) -> None:
        with self._tx() as c:
            self._finish(c, node_id, finish)

    def rename(self, conversation_id: int, title: str) -> None:
        with self._tx() as c:
            cur = c.execute(
                "UPDATE conversations SET title = ?, updated = ? WHERE id = ?", (title, time.time(), conversation_id)
            )
            if cur.rowcount != 1:
                raise KeyError(f"no conversation {conversation_id}")

    def delete(self, conversation_id: int, node_id: int | None = None) -> None:
        """The conversation; given `node_id`, only that node and the nodes below it."""
        sql, args = (
            ("DELETE FROM conversations WHERE id = ?", (conversation_id,))
            if node_id is None
            else ("DELETE FROM nodes WHERE id = ? AND conversation_id = ?", (node_id, conversation_id))
        )
        with self._tx() as c:
            if c.execute(sql, args).rowcount != 1:
                raise KeyError(f"no conversation {conversation_id}" + (f" node {node_id}" if node_id else ""))

    # ---- reading (reads.py) --------------------------------------------------------------------------
    def list_conversations(self, search: str = "", limit: int = 200) -> list[ConversationSummary]:
        """Newest first (last written to); `search`: conversations whose messages or title hold
        every word of it (a word matches the start of a word: "gen" finds "generation")."""
        return reads.list_conversations(self._conn, self._fts, search, limit)

    def summary(self, conversation_id: int) -> ConversationSummary:
        """One conversation's line of the list, without its events; KeyError if there is none."""
        return reads.summary(self._conn, conversation_id)

    def load(self, conversation_id: int) -> StoredConversation:
        """The whole conversation with every reply's events; KeyError if there is none."""
        return reads.load(self._conn, self.path, conversation_id)

    def step_bytes(self, node_id: int) -> int:
        """Bytes the reply's step batches take in the file (their blobs)."""
        return reads.step_bytes(self._conn, node_id)
