"""The conversation store (history/): real SQLite files in temp folders, real replies
from the default model. Round trips, the tree, search, the v1 -> v2 migration, damaged,
newer and read-only files, a full disk, and a writer SIGKILLed mid-reply."""

from __future__ import annotations

import json
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from history_helpers import SYSTEM, as_json, folder_to_lock, generate, make_readonly, short_reply, store_reply, tmpfs

from loopchat.engine.engine import Engine
from loopchat.event_json import to_json_dict
from loopchat.events import Finish, FinishReason, Message, Prefill, Step
from loopchat.history import schema, step_codec
from loopchat.history.step_codec import decode_steps, encode_steps
from loopchat.history.store import (
    CUT,
    SCHEMA_VERSION,
    ConversationStore,
    StoreError,
    _start_blob,
    search_like,
)
from loopchat.history.writer import StoreWriter
from loopchat.settings import SamplingSettings

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def long_reply(engine: Engine) -> list:
    """500 tokens (no early stop), with the temperature changed at pass 200 as a user would."""
    base = SamplingSettings(seed=7, max_tokens=500, temperature=0.8)
    changed = base.replace(temperature=1.1)
    count = {"n": 0}

    def settings() -> SamplingSettings:
        count["n"] += 1
        return base if count["n"] <= 200 else changed

    return generate(engine, [SYSTEM, Message("user", "Tell me a long story about the sea.")], settings, ignore_eos=True)


def integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def test_a_500_token_reply_round_trips_exactly_and_compactly(long_reply, tmp_path: Path) -> None:
    steps = [e for e in long_reply if isinstance(e, Step)]
    assert len(steps) == 500 and len({s.settings for s in steps}) == 2
    path = tmp_path / "h.sqlite3"
    with ConversationStore.open(path) as store:
        conv = store.new_conversation("story", "SmolLM2", "/m.gguf", 123, SYSTEM.content)
        user = store.add_message(conv, None, "user", "Tell me a long story about the sea.")
        node = store_reply(store, conv, user, long_reply)
        per_step = store.step_bytes(node) / len(steps)
        loaded = store.load(conv)
    reply = loaded.node(node)
    assert reply.status == "complete" and reply.mode == "stream"
    assert reply.content == long_reply[-1].text
    assert as_json(reply.events) == as_json(long_reply)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    size = path.stat().st_size  # the whole file: indexes, the Start's prompt, the search index
    print(f"\n{per_step:.0f} bytes per step (top 10 raw + sampled); file {size} bytes for one 500-token reply")
    assert size < 500_000
    assert per_step * 500 < 500_000
    assert per_step < 600


def test_step_codec_keeps_every_value(long_reply) -> None:
    steps = [e for e in long_reply if isinstance(e, Step)]
    assert step_codec.FORMAT == max(step_codec.FIELDS)  # a Step field was added: give it a format (FIELDS)
    for fmt in (None, 0, 1):  # the format written now, the self-describing one, the first
        for batch in (steps[:1], steps[195:205], steps):
            back = decode_steps(encode_steps(batch, fmt))
            if fmt == 1:  # format 1 holds the fields Step had then; a later one gets its default
                new = [f for f in step_codec.CURRENT_FIELDS if f not in step_codec.FIELDS[1]]
                batch = [replace(s, **{f: getattr(back[0], f) for f in new}) for s in batch]
            assert as_json(back) == as_json(batch)
        assert decode_steps(encode_steps([], fmt)) == []
    with pytest.raises(step_codec.StepCodecError):
        decode_steps(b"z" + os.urandom(100))


def test_a_tree_with_branches_round_trips(engine: Engine, tmp_path: Path) -> None:
    a = short_reply(engine, "Name a colour.", 1)
    b = short_reply(engine, "Name a colour.", 2)  # F5: a sibling of a, same user message
    c = short_reply(engine, "And another?", 3, Message("user", "Name a colour."), Message("assistant", b[-1].text))
    with ConversationStore.open(tmp_path / "h.sqlite3") as store:
        conv = store.new_conversation("colours", "SmolLM2")
        sys_id = store.add_message(conv, None, "system", SYSTEM.content)
        u1 = store.add_message(conv, sys_id, "user", "Name a colour.")
        ra = store_reply(store, conv, u1, a, mode="blocking")
        rb = store_reply(store, conv, u1, b)
        u2 = store.add_message(conv, rb, "user", "And another?")
        rc = store_reply(store, conv, u2, c)
        loaded = store.load(conv)
        summary = store.list_conversations()[0]
    assert summary.replies == 3 and summary.cut == 0 and summary.title == "colours"
    assert [n.id for n in loaded.path()] == [sys_id, u1, rb, u2, rc]
    assert [n.id for n in loaded.path(ra)] == [sys_id, u1, ra]
    assert [n.id for n in loaded.children(u1)] == [ra, rb]
    assert [n.id for n in loaded.children(None)] == [sys_id]
    assert loaded.node(ra).mode == "blocking"
    for node, events in ((ra, a), (rb, b), (rc, c)):
        assert as_json(loaded.node(node).events) == as_json(events)
    # parents before children
    seen: set[int] = set()
    for n in loaded.nodes:
        assert n.parent_id is None or n.parent_id in seen
        seen.add(n.id)


def test_search_over_messages_and_titles(tmp_path: Path) -> None:
    with ConversationStore.open(tmp_path / "h.sqlite3") as store:
        sea = store.new_conversation("Sea shanties", "m")
        store.add_message(sea, None, "user", "Why is the ocean salty?")
        sky = store.new_conversation("Weather", "m")
        store.add_message(sky, None, "user", "Why is the sky blue? 50% of the time")
        ids = lambda q: [s.id for s in store.list_conversations(q)]  # noqa: E731
        assert ids("why") == [sky, sea]  # newest first
        assert ids("sal") == [sea]  # a word's start
        assert ids("why sky") == [sky] and ids("shanties") == [sea] and ids("SEA") == [sea]
        assert ids("ocean weather") == []  # every word, in one conversation
        assert ids("50%") == [sky] and ids('"') == []  # punctuation: looked for as text
        store.rename(sea, "Salt water")
        assert ids("shanties") == [] and ids("water") == [sea]
        store.delete(sky)
        assert ids("why") == [sea]
        # the LIKE search (no FTS5) finds the same
        assert search_like(store._conn, "ocean") == {sea} and search_like(store._conn, "WATER") == {sea}
        assert search_like(store._conn, "%") == set()
        store._fts = False  # as with a sqlite3 module without FTS5
        assert ids("why") == [sea] and ids("alt wat") == [sea] and ids("sky") == []


def _v1_file(path: Path, events) -> None:
    """A history file as version 1 wrote it: its own DDL, its rows."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    schema.create_v1(conn)
    conn.execute("INSERT INTO conversations VALUES (1, 'old talk', 'SmolLM2', '/m.gguf', 5, NULL, 100.0, 200.0)")
    conn.execute(
        "INSERT INTO nodes (id, conversation_id, parent_id, role, content, created) VALUES (1, 1, NULL, 'user', 'Hi there', 100.0)"
    )
    conn.execute(
        "INSERT INTO nodes (id, conversation_id, parent_id, role, content, created, mode, status, start, finish)"
        " VALUES (2, 1, 1, 'assistant', ?, 101.0, 'stream', 'complete', ?, ?)",
        (events[-1].text, _start_blob(events[0]), json.dumps(to_json_dict(events[-1]))),
    )
    body = events[1:-1]
    conn.execute(
        "INSERT INTO reply_events (node_id, codec, data) VALUES (2, 'json', ?)",
        (json.dumps(to_json_dict(body[0])).encode(),),
    )
    conn.execute("INSERT INTO reply_events (node_id, codec, data) VALUES (2, 'steps', ?)", (encode_steps(body[1:]),))
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()


def test_a_v1_file_is_migrated_with_its_data(engine: Engine, tmp_path: Path) -> None:
    events = short_reply(engine, "Hi there", 4)
    assert isinstance(events[1], Prefill)
    path = tmp_path / "v1.sqlite3"
    _v1_file(path, events)
    with ConversationStore.open(path) as store:
        assert store._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
        [summary] = store.list_conversations()
        assert (summary.title, summary.replies, summary.created, summary.updated) == ("old talk", 1, 100.0, 200.0)
        loaded = store.load(1)
        assert [n.content for n in loaded.path()] == ["Hi there", events[-1].text]
        assert as_json(loaded.node(2).events) == as_json(events)
        # the v2 search index holds the v1 rows
        assert [s.id for s in store.list_conversations("there")] == [1]
        assert [s.id for s in store.list_conversations("old")] == [1]
    assert integrity(path) == "ok"


def _file_bytes(path: Path) -> bytes:
    return path.read_bytes()


@pytest.fixture(scope="module")
def fill_reply(engine: Engine) -> list:
    """The 40-token reply each damaged file is filled with: drawn once (the same events every time)."""
    return short_reply(engine, "Fill the file.", 5, max_tokens=40)


def _filled(path: Path, events: list) -> None:
    with ConversationStore.open(path) as store:
        for i in range(30):
            conv = store.new_conversation(f"talk {i}", "m")
            store_reply(store, conv, store.add_message(conv, None, "user", "x" * 500), events)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def test_a_newer_file_is_refused_and_not_written(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    ConversationStore.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    before = _file_bytes(path)
    with pytest.raises(StoreError) as err:
        ConversationStore.open(path)
    msg = str(err.value)
    assert "newer loopchat" in msg and "schema 3" in msg and "\n" not in msg
    assert _file_bytes(path) == before


@pytest.mark.parametrize("damage", ["truncated", "garbage", "garbage pages", "other program"])
def test_a_damaged_file_is_refused_and_not_written(damage: str, fill_reply: list, tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    _filled(path, fill_reply)
    data = _file_bytes(path)
    assert len(data) > 16 * 4096
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(os.urandom(len(data)))
    elif damage == "garbage pages":  # a valid header, then pages of noise
        path.write_bytes(data[:8192] + os.urandom(8 * 4096) + data[8192 + 8 * 4096 :])
    else:
        path.unlink()
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE notes (x)")
        conn.commit()
        conn.close()
    before = _file_bytes(path)
    with pytest.raises(StoreError) as err:
        ConversationStore.open(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg
    assert ("another program" in msg) if damage == "other program" else ("damaged" in msg and "move it away" in msg)
    assert _file_bytes(path) == before
    # the writer says it once, and writes nothing
    errors: list[str] = []
    writer = StoreWriter(path, on_error=errors.append)
    ref = writer.new_conversation(title="t", model_name="m")
    assert writer.flush()
    writer.close()
    assert errors == [msg]
    with pytest.raises(StoreError):
        ref.result(1)
    assert _file_bytes(path) == before


def test_a_read_only_folder(engine: Engine, tmp_path: Path) -> None:
    events = short_reply(engine, "Hello", 6)
    with folder_to_lock(tmp_path / "ro") as folder:
        path = folder / "h.sqlite3"
        with ConversationStore.open(path) as store:
            conv = store.new_conversation("kept", "m")
            store_reply(store, conv, None, events)
        make_readonly(folder)
        for target in (path, folder / "new.sqlite3", folder / "sub" / "h.sqlite3"):
            with pytest.raises(StoreError) as err:
                ConversationStore.open(target)
            assert "cannot write the history file" in str(err.value) and "\n" not in str(err.value)
        errors: list[str] = []
        writer = StoreWriter(path, on_error=errors.append)
        refs = [writer.new_conversation(title=f"t{i}", model_name="m") for i in range(3)]
        writer.add_events(refs[0], events[1:-1])
        assert writer.flush()
        writer.close()
        assert len(errors) == 1 and "cannot write" in errors[0]
        for ref in refs:
            with pytest.raises(StoreError):
                ref.result(1)
        # what was there is intact (read-only, as the CLI could)
        assert _file_bytes(path)[:16] == b"SQLite format 3\x00"


def test_a_full_disk_is_reported_once_and_the_file_stays_sound(long_reply, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", size="3m") as folder:
        path = folder / "h.sqlite3"
        errors: list[str] = []
        writer = StoreWriter(path, on_error=errors.append)
        conv = writer.new_conversation(title="big", model_name="m")
        body = long_reply[1:-1]
        refs = []
        for _ in range(40):  # ~40 replies of 500 steps: far more than 3 MB
            reply = writer.begin_reply(conv, None, "stream", long_reply[0])
            refs.append(reply)
            for j in range(0, len(body), 25):
                writer.add_events(reply, body[j : j + 25])
            writer.finish_reply(reply, long_reply[-1])
        assert writer.flush(60)
        writer.close()
        assert len(errors) == 1 and "disk" in errors[0] and "full" in errors[0], errors
        written = [r for r in refs if r.done and r._error is None]
        assert 0 < len(written) < 40
        assert integrity(path) == "ok"
        with ConversationStore.open(path) as store:
            loaded = store.load(conv.result(0))
            complete = [n for n in loaded.nodes if n.status == "complete"]
            assert complete and all(as_json(n.events) == as_json(long_reply) for n in complete)


_CHILD = textwrap.dedent("""
    import pickle, sys
    from loopchat.history.writer import StoreWriter
    events = pickle.load(open(sys.argv[2], "rb"))
    writer = StoreWriter(sys.argv[1])
    conv = writer.new_conversation(title="killed", model_name="m")
    user = writer.add_message(conv, None, "user", "Count")
    reply = writer.begin_reply(conv, user, "stream", events[0])
    body = events[1:-1]
    for i in range(0, 61, 5):  # the prefill and 60 steps, in batches of 5
        writer.add_events(reply, body[i:min(i + 5, 61)])
    assert writer.flush(30)
    print(reply.result(1), flush=True)
    sys.stdin.read()  # the test kills us here, mid-reply
""")


def test_a_writer_killed_mid_reply_leaves_a_cut_reply(long_reply, tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    pickled = tmp_path / "events.pickle"
    pickled.write_bytes(pickle.dumps(long_reply))
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), str(pickled)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        node = int(child.stdout.readline())
        # while the writer lives, its reply is not cut
        with ConversationStore.open(path) as store:
            assert store.load(1).node(node).status == "generating"
            assert store.list_conversations()[0].cut == 0
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    assert Path(str(path) + "-wal").exists()  # killed: nothing checkpointed it
    with ConversationStore.open(path) as store:
        summary = store.list_conversations()[0]
        reply = store.load(1).node(node)
    assert (summary.replies, summary.cut) == (1, 1)
    assert reply.status == "cut"
    steps = [e for e in reply.events if isinstance(e, Step)]
    assert as_json(reply.events[:-1]) == as_json(long_reply[:62])  # Start, Prefill, 60 steps
    finish = reply.events[-1]
    assert isinstance(finish, Finish) and finish.reason == FinishReason.ERROR and finish.error == CUT
    assert finish.text == reply.content == "".join(s.text for s in steps) and len(steps) == 60
    assert integrity(path) == "ok"


def test_the_writer_resolves_ids_and_round_trips(long_reply, tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    errors: list[str] = []
    writer = StoreWriter(path, on_error=errors.append)
    conv = writer.new_conversation(title="w", model_name="m", system_prompt="be brief")
    user = writer.add_message(conv, None, "user", "Tell me a long story about the sea.")
    reply = writer.begin_reply(conv, user, "stream", long_reply[0])
    body = long_reply[1:]
    for i in range(0, len(body), 7):  # the Finish comes in the last batch
        writer.add_events(reply, body[i : i + 7])
    bad = writer.add_message(12345, None, "user", "no such conversation")
    after = writer.add_message(conv, reply, "user", "thanks")
    assert writer.flush()
    writer.close()
    assert errors == []  # a bad id fails that write only
    with pytest.raises(StoreError):
        bad.result(0)
    with ConversationStore.open(path) as store:
        loaded = store.load(conv.result(0))
    assert loaded.system_prompt == "be brief"
    assert [n.id for n in loaded.path()] == [user.result(0), reply.result(0), after.result(0)]
    assert as_json(loaded.node(reply.result(0)).events) == as_json(long_reply)


def test_two_connections_and_a_thread(long_reply, tmp_path: Path) -> None:
    """The chat reads (list, load) on its own connection while the writer thread writes."""
    path = tmp_path / "h.sqlite3"
    writer = StoreWriter(path)
    conv = writer.new_conversation(title="live", model_name="m")
    reply = writer.begin_reply(conv, None, "stream", long_reply[0])
    writer.flush()
    reader = ConversationStore.open(path)
    stop = threading.Event()

    def feed() -> None:
        body = long_reply[1:-1]
        for i in range(0, len(body), 5):
            writer.add_events(reply, body[i : i + 5])
        writer.finish_reply(reply, long_reply[-1])
        writer.flush(30)
        stop.set()

    t = threading.Thread(target=feed)
    t.start()
    while not stop.is_set():
        node = reader.load(conv.result(0)).node(reply.result(0))
        assert node.status in ("generating", "complete")
    t.join()
    assert reader.load(conv.result(0)).node(reply.result(0)).status == "complete"
    reader.close()
    writer.close()


def test_the_reader_reads_and_never_writes(engine: Engine, tmp_path: Path) -> None:
    """The chat's list reads on the UI thread through open_reader: no write, no lock."""
    path = tmp_path / "h.sqlite3"
    with pytest.raises(StoreError, match="no conversation is stored yet"):
        ConversationStore.open_reader(path)
    assert not path.exists()
    with ConversationStore.open(path) as store:
        cid = store.new_conversation("Sea", "m")
        store.add_message(cid, None, "user", "Why is the ocean salty?")
    before = path.read_bytes()
    with ConversationStore.open_reader(path) as reader:
        assert [s.id for s in reader.list_conversations("ocean")] == [cid]
        assert reader.load(cid).path()[0].content == "Why is the ocean salty?"
        with pytest.raises(sqlite3.OperationalError):
            reader.rename(cid, "Salt")
        assert path.read_bytes() == before
        # a writer may write meanwhile: the reader takes no lock that stops it
        with ConversationStore.open(path) as writer:
            writer.rename(cid, "Salt")
        assert [s.title for s in reader.list_conversations()] == ["Salt"]
    # a file not yet migrated: the reader says what to do and does not migrate it
    old = tmp_path / "v1.sqlite3"
    _v1_file(old, short_reply(engine, "Hi there", 3))
    with pytest.raises(StoreError, match="older loopchat"):
        ConversationStore.open_reader(old)
    with sqlite3.connect(old) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1


def test_the_chat_opening_its_list_keeps_the_writers_file_safe_from_another_process(tmp_path: Path) -> None:
    """The chat's writer holds the file while Ctrl+O reads it (open_reader); then another
    process (`loopchat history list`, a second chat) opens and closes it. That process
    must not take the file for unused and delete the WAL the writer still writes to."""
    path = tmp_path / "h.sqlite3"
    with ConversationStore.open(path) as writer:
        cid = writer.new_conversation("Sea", "m")
        with ConversationStore.open_reader(path) as reader:
            assert [s.id for s in reader.list_conversations()] == [cid]
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]);"
                " c.execute('SELECT count(*) FROM conversations').fetchone(); c.close()",
                str(path),
            ],
            check=True,
            timeout=60,
        )
        assert (tmp_path / "h.sqlite3-wal").exists()
        writer.rename(cid, "Salt")
        with ConversationStore.open(tmp_path / "h.sqlite3") as other:
            assert [s.title for s in other.list_conversations()] == ["Salt"]
