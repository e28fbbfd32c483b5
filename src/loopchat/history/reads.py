"""The store's reads, as functions of its connection: the list of conversations (newest
first, with the search: FTS5 where the file has it, else LIKE), one conversation's line,
a whole conversation with every reply's events, and what a reply's steps take.
ConversationStore's read methods are these (store.py).
"""

from __future__ import annotations

import json
import sqlite3
import zlib
from dataclasses import replace
from pathlib import Path

from loopchat.event_json import event_from_json_dict
from loopchat.event_lines import prefix_text
from loopchat.events import Event, Finish, Start, Step
from loopchat.history.checks import damaged
from loopchat.history.records import CUT, ConversationSummary, StoredConversation, StoredNode
from loopchat.history.step_codec import StepCodecError, decode_steps
from loopchat.trace import TracedEvent, cut_short_finish

SUMMARY = (
    "SELECT c.id, c.title, c.model_name, c.created, c.updated,"
    " (SELECT count(*) FROM nodes n WHERE n.conversation_id = c.id AND n.role = 'assistant'),"
    " (SELECT count(*) FROM nodes n WHERE n.conversation_id = c.id AND n.status = 'cut')"
    " FROM conversations c"
)


def list_conversations(
    conn: sqlite3.Connection, fts: bool, search: str = "", limit: int = 200
) -> list[ConversationSummary]:
    """Newest first (last written to); `search`: conversations whose messages or title hold
    every word of it (a word matches the start of a word: "gen" finds "generation").
    `fts`: the file has the FTS5 index."""
    words = search.split()
    if words:
        ids = _search(conn, fts, words)
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = conn.execute(
            f"{SUMMARY} WHERE c.id IN ({marks}) ORDER BY c.updated DESC, c.id DESC LIMIT ?",
            (*ids, limit),
        ).fetchall()
    else:
        rows = conn.execute(f"{SUMMARY} ORDER BY c.updated DESC, c.id DESC LIMIT ?", (limit,)).fetchall()
    return [ConversationSummary(*row) for row in rows]


def _search(conn: sqlite3.Connection, fts: bool, words: list[str]) -> set[int]:
    found: set[int] | None = None
    for word in words:
        ids = _search_fts(conn, word) if fts else None
        if ids is None:
            ids = search_like(conn, word)
        found = ids if found is None else found & ids
        if not found:
            return set()
    return found or set()


def _search_fts(conn: sqlite3.Connection, word: str) -> set[int] | None:
    query = '"' + word.replace('"', '""') + '"*'
    try:
        ids = {r[0] for r in conn.execute("SELECT conversation_id FROM node_text WHERE node_text MATCH ?", (query,))}
        ids |= {r[0] for r in conn.execute("SELECT rowid FROM title_text WHERE title_text MATCH ?", (query,))}
    except sqlite3.OperationalError:  # a word FTS5 cannot take (only punctuation, ...)
        return None
    if not ids and not any(ch.isalnum() for ch in word):
        return None  # punctuation is not indexed: look for it as text
    return ids


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


def summary(conn: sqlite3.Connection, conversation_id: int) -> ConversationSummary:
    """One conversation's line of the list, without its events; KeyError if there is none."""
    row = conn.execute(f"{SUMMARY} WHERE c.id = ?", (conversation_id,)).fetchone()
    if row is None:
        raise KeyError(conversation_id)
    return ConversationSummary(*row)


def load(conn: sqlite3.Connection, path: Path, conversation_id: int) -> StoredConversation:
    """The whole conversation with every reply's events; KeyError if there is none."""
    head = summary(conn, conversation_id)
    model_path, model_size, system_prompt = conn.execute(
        "SELECT model_path, model_size, system_prompt FROM conversations WHERE id = ?", (conversation_id,)
    ).fetchone()
    nodes = []
    for nid, parent, role, content, created, mode, status in conn.execute(
        "SELECT id, parent_id, role, content, created, mode, status FROM nodes WHERE conversation_id = ? ORDER BY id",
        (conversation_id,),
    ).fetchall():
        events = reply_events(conn, path, nid, status) if role == "assistant" else []
        if status != "complete" and events and isinstance(events[-1], Finish):
            content = events[-1].text
        elif status == "generating":
            content = "".join(e.text for e in events if isinstance(e, Step))
        if status != "generating" and events and isinstance(events[0], Start):
            # a branch: its Finish holds its run's text; the reply begins with the
            # text of the steps it continued from
            content = prefix_text(events[0], (e for e in events if isinstance(e, Step))) + content
        nodes.append(StoredNode(nid, parent, role, content, created, mode, events, status))
    return StoredConversation(head, model_path, model_size, system_prompt, nodes)


def reply_events(conn: sqlite3.Connection, path: Path, node_id: int, status: str) -> list[Event]:
    """A reply's events, Start to Finish; a reply marked cut ends with a made-up Finish (error CUT)."""
    start_blob, finish_json = conn.execute("SELECT start, finish FROM nodes WHERE id = ?", (node_id,)).fetchone()
    if start_blob is None:
        return []
    events: list[Event] = [event_from_json_dict(json.loads(zlib.decompress(start_blob)))]
    for codec, data in conn.execute("SELECT codec, data FROM reply_events WHERE node_id = ? ORDER BY id", (node_id,)):
        if codec == "steps":
            try:
                events.extend(decode_steps(data))
            except StepCodecError as exc:
                raise damaged(path, f"reply {node_id}: {exc}") from None
        else:
            events.append(event_from_json_dict(json.loads(data)))
    if finish_json is not None:
        events.append(event_from_json_dict(json.loads(finish_json)))
    elif status == "cut":
        made_up = cut_short_finish([TracedEvent(0.0, e) for e in events]).event
        assert isinstance(made_up, Finish)
        events.append(replace(made_up, error=CUT))
    return events


def step_bytes(conn: sqlite3.Connection, node_id: int) -> int:
    """Bytes the reply's step batches take in the file (their blobs)."""
    row = conn.execute(
        "SELECT coalesce(sum(length(data)), 0) FROM reply_events WHERE node_id = ? AND codec = 'steps'", (node_id,)
    ).fetchone()
    return int(row[0])
