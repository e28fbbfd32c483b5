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
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import quote

from loopchat.errors import one_line
from loopchat.events import (
    ContextTrimmed,
    Event,
    Finish,
    Prefill,
    Start,
    Step,
    event_from_json_dict,
    prefix_text,
    to_json_dict,
)
from loopchat.history import schema
from loopchat.history.liveness import process_started, writer_alive
from loopchat.history.schema import SCHEMA_VERSION
from loopchat.history.step_codec import StepCodecError, decode_steps, encode_steps
from loopchat.private_files import private_dir, private_file, tighten
from loopchat.trace import TracedEvent, cut_short_finish

__all__ = [
    "SCHEMA_VERSION",
    "CUT",
    "ConversationStore",
    "ConversationSummary",
    "StoreError",
    "StoredConversation",
    "StoredNode",
    "default_store_path",
]

#: Finish.error of the Finish `load` makes up for a reply marked cut.
CUT = "cut short: loopchat stopped before this reply finished (the steps written until then are kept)"

_SQLITE_MAGIC = b"SQLite format 3\x00"


class StoreError(Exception):
    """One line that says what to do (e.g. "the history file ~/.local/share/loopchat/history.sqlite3 is
    damaged (file is not a database): move it away to start a new one; loopchat runs with history off")."""


def default_store_path() -> Path:
    from loopchat.paths import data_dir

    return data_dir() / "history.sqlite3"


@dataclass(frozen=True)
class ConversationSummary:
    id: int
    title: str
    model_name: str
    created: float  # Unix seconds
    updated: float
    replies: int  # assistant replies stored (all branches)
    cut: int  # replies marked cut (the app was killed mid-reply)


@dataclass
class StoredNode:
    """One message of the tree."""

    id: int
    parent_id: int | None
    role: str  # "system" | "user" | "assistant" | "document"
    content: str  # the message text (for a reply: Finish.text, or the text so far if cut)
    created: float
    mode: str | None = None  # a reply's delivery: "stream" | "blocking"
    #: a reply's events in order: Start, [ContextTrimmed], Prefill, Step..., Finish. A cut
    #: reply ends with a made-up Finish (reason ERROR, error CUT); a reply another process
    #: is still writing ("generating") has no Finish yet.
    events: list = field(default_factory=list)
    status: str = "complete"  # "complete" | "cut" | "generating"


@dataclass
class StoredConversation:
    summary: ConversationSummary
    model_path: str
    model_size: int
    system_prompt: str | None
    nodes: list[StoredNode]  # every node, parents before children

    def node(self, node_id: int) -> StoredNode:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def children(self, node_id: int | None) -> list[StoredNode]:
        return [n for n in self.nodes if n.parent_id == node_id]

    def latest_leaf(self, under: int | None = None) -> int | None:
        """The most recent leaf (the last node written that has no child) of the whole
        tree, or of the nodes below node `under` (None: no node, or none below it)."""
        parents = {n.parent_id for n in self.nodes}
        by_id = {n.id: n for n in self.nodes}

        def below(node_id: int) -> bool:
            at = by_id[node_id].parent_id
            while at is not None and at != under:
                at = by_id[at].parent_id
            return at == under

        leaves = (n.id for n in self.nodes if n.id not in parents)
        return max((leaf for leaf in leaves if under is None or below(leaf)), default=None)

    def path(self, leaf_id: int | None = None) -> list[StoredNode]:
        """Root -> leaf; by default the most recent leaf (the last node written that has no child)."""
        if leaf_id is None:
            leaf_id = self.latest_leaf()
            if leaf_id is None:
                return []
        by_id = {n.id: n for n in self.nodes}
        out: list[StoredNode] = []
        at: int | None = leaf_id
        while at is not None:
            node = by_id[at]
            out.append(node)
            at = node.parent_id
        return out[::-1]


def _damaged(path: Path, why: str) -> StoreError:
    return StoreError(
        f"the history file {path} is damaged ({one_line(why)}): move it away to start a new one; "
        "loopchat runs with history off"
    )


def _cannot_write(path: Path, why: str) -> StoreError:
    return StoreError(
        f"cannot write the history file {path} ({one_line(why)}): make its folder writable, or run with --no-history"
    )


def _newer(path: Path, version: int) -> StoreError:
    return StoreError(
        f"the history file {path} was written by a newer loopchat (schema {version}; this one reads "
        f"up to {SCHEMA_VERSION}): upgrade loopchat, or move the file away to start a new one"
    )


def _check_existing(path: Path, header: bool = True) -> int:
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
            raise _damaged(path, "not an SQLite database")
        page_size = int.from_bytes(head[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        pages = int.from_bytes(head[28:32], "big")
        wal = Path(str(path) + "-wal")
        wal_size = wal.stat().st_size if wal.exists() else 0
        if wal_size == 0 and pages and size < pages * page_size:
            raise _damaged(path, f"truncated: {size} bytes of {pages * page_size}")
    try:
        ro = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read the history file {path} ({one_line(str(exc))})") from None
    try:
        version = ro.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise _newer(path, version)
        problems = [row[0] for row in ro.execute("PRAGMA quick_check(5)")]
        if problems != ["ok"]:
            raise _damaged(path, problems[0])
        if version == 0 and ro.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise StoreError(f"{path} is an SQLite file of another program: use another path for the history")
        return version
    except sqlite3.DatabaseError as exc:  # "file is not a database", "database disk image is malformed"
        if isinstance(exc, sqlite3.OperationalError) and "unable to open" in str(exc):
            raise StoreError(f"cannot read the history file {path} ({one_line(str(exc))})") from None
        raise _damaged(path, str(exc)) from None
    finally:
        ro.close()


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
            raise _cannot_write(path, f"cannot create {path.parent}: {exc.strerror}") from None
        for target in (path.parent, path):  # WAL mode writes files beside it: the folder too
            if target.exists() and not os.access(target, os.W_OK):
                raise _cannot_write(path, f"{target} is read-only")
        _check_existing(path)
        try:
            conn = sqlite3.connect(str(private_file(path)), timeout=10, isolation_level=None)
        except sqlite3.Error as exc:
            raise _cannot_write(path, str(exc)) from None
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise _cannot_write(path, f"journal mode {mode}, not WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            # the version again, under the write lock: another process may have created it meanwhile
            conn.execute("BEGIN IMMEDIATE")
            try:
                current = conn.execute("PRAGMA user_version").fetchone()[0]
                if current > SCHEMA_VERSION:
                    raise _newer(path, current)
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
                raise _cannot_write(path, text) from None
            raise _damaged(path, text) from None

    @classmethod
    def open_reader(cls, path: Path | str | None = None) -> ConversationStore:
        """A read-only connection, for reading on a thread that must not write (the chat's
        conversation list, on the UI thread): no lock, no migration, no marking of cut
        replies (the writer's own `open` did those). StoreError as `open`, and for a file
        not yet migrated to this version."""
        path = Path(path).expanduser() if path is not None else default_store_path()
        version = _check_existing(path, header=False)  # the chat's writer holds it open
        if version == 0:
            raise StoreError(f"no conversation is stored yet ({path})")
        if version > SCHEMA_VERSION:
            raise _newer(path, version)
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
            raise _damaged(path, str(exc)) from None

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
        events = self._reply_events(node_id, "cut")
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
            return int(cur.lastrowid)

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
        return int(cur.lastrowid)

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

    # ---- reading -------------------------------------------------------------------------------------
    _SUMMARY = (
        "SELECT c.id, c.title, c.model_name, c.created, c.updated,"
        " (SELECT count(*) FROM nodes n WHERE n.conversation_id = c.id AND n.role = 'assistant'),"
        " (SELECT count(*) FROM nodes n WHERE n.conversation_id = c.id AND n.status = 'cut')"
        " FROM conversations c"
    )

    def list_conversations(self, search: str = "", limit: int = 200) -> list[ConversationSummary]:
        """Newest first (last written to); `search`: conversations whose messages or title hold
        every word of it (a word matches the start of a word: "gen" finds "generation")."""
        words = search.split()
        if words:
            ids = self._search(words)
            if not ids:
                return []
            marks = ",".join("?" * len(ids))
            rows = self._conn.execute(
                f"{self._SUMMARY} WHERE c.id IN ({marks}) ORDER BY c.updated DESC, c.id DESC LIMIT ?",
                (*ids, limit),
            ).fetchall()
        else:
            rows = self._conn.execute(
                f"{self._SUMMARY} ORDER BY c.updated DESC, c.id DESC LIMIT ?", (limit,)
            ).fetchall()
        return [ConversationSummary(*row) for row in rows]

    def _search(self, words: list[str]) -> set[int]:
        found: set[int] | None = None
        for word in words:
            ids = self._search_fts(word) if self._fts else None
            if ids is None:
                ids = search_like(self._conn, word)
            found = ids if found is None else found & ids
            if not found:
                return set()
        return found or set()

    def _search_fts(self, word: str) -> set[int] | None:
        query = '"' + word.replace('"', '""') + '"*'
        try:
            ids = {
                r[0]
                for r in self._conn.execute("SELECT conversation_id FROM node_text WHERE node_text MATCH ?", (query,))
            }
            ids |= {r[0] for r in self._conn.execute("SELECT rowid FROM title_text WHERE title_text MATCH ?", (query,))}
        except sqlite3.OperationalError:  # a word FTS5 cannot take (only punctuation, ...)
            return None
        if not ids and not any(ch.isalnum() for ch in word):
            return None  # punctuation is not indexed: look for it as text
        return ids

    def summary(self, conversation_id: int) -> ConversationSummary:
        """One conversation's line of the list, without its events; KeyError if there is none."""
        row = self._conn.execute(f"{self._SUMMARY} WHERE c.id = ?", (conversation_id,)).fetchone()
        if row is None:
            raise KeyError(conversation_id)
        return ConversationSummary(*row)

    def load(self, conversation_id: int) -> StoredConversation:
        """The whole conversation with every reply's events; KeyError if there is none."""
        summary = self.summary(conversation_id)
        model_path, model_size, system_prompt = self._conn.execute(
            "SELECT model_path, model_size, system_prompt FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        nodes = []
        for nid, parent, role, content, created, mode, status in self._conn.execute(
            "SELECT id, parent_id, role, content, created, mode, status FROM nodes WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        ).fetchall():
            events = self._reply_events(nid, status) if role == "assistant" else []
            if status != "complete" and events and isinstance(events[-1], Finish):
                content = events[-1].text
            elif status == "generating":
                content = "".join(e.text for e in events if isinstance(e, Step))
            if status != "generating" and events and isinstance(events[0], Start):
                # a branch: its Finish holds its run's text; the reply begins with the
                # text of the steps it continued from
                content = prefix_text(events[0], (e for e in events if isinstance(e, Step))) + content
            nodes.append(StoredNode(nid, parent, role, content, created, mode, events, status))
        return StoredConversation(summary, model_path, model_size, system_prompt, nodes)

    def _reply_events(self, node_id: int, status: str) -> list[Event]:
        start_blob, finish_json = self._conn.execute(
            "SELECT start, finish FROM nodes WHERE id = ?", (node_id,)
        ).fetchone()
        if start_blob is None:
            return []
        events: list[Event] = [event_from_json_dict(json.loads(zlib.decompress(start_blob)))]
        for codec, data in self._conn.execute(
            "SELECT codec, data FROM reply_events WHERE node_id = ? ORDER BY id", (node_id,)
        ):
            if codec == "steps":
                try:
                    events.extend(decode_steps(data))
                except StepCodecError as exc:
                    raise _damaged(self.path, f"reply {node_id}: {exc}") from None
            else:
                events.append(event_from_json_dict(json.loads(data)))
        if finish_json is not None:
            events.append(event_from_json_dict(json.loads(finish_json)))
        elif status == "cut":
            made_up = cut_short_finish([TracedEvent(0.0, e) for e in events]).event
            events.append(replace(made_up, error=CUT))
        return events

    def step_bytes(self, node_id: int) -> int:
        """Bytes the reply's step batches take in the file (their blobs)."""
        row = self._conn.execute(
            "SELECT coalesce(sum(length(data)), 0) FROM reply_events WHERE node_id = ? AND codec = 'steps'", (node_id,)
        ).fetchone()
        return int(row[0])


def search_like(conn: sqlite3.Connection, word: str) -> set[int]:
    """The conversations whose messages or title hold `word` (case-insensitive for ASCII):
    the search without FTS5, and for words FTS5 does not index (punctuation)."""
    pattern = "%" + word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    ids = {
        r[0]
        for r in conn.execute("SELECT DISTINCT conversation_id FROM nodes WHERE content LIKE ? ESCAPE '\\'", (pattern,))
    }
    ids |= {r[0] for r in conn.execute("SELECT id FROM conversations WHERE title LIKE ? ESCAPE '\\'", (pattern,))}
    return ids
