"""Export (Markdown, trace, JSON: atomic) and import (a trace -> a conversation), on real
replies from the default model and real SQLite files."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from history_helpers import SYSTEM, as_json, short_reply, store_reply, tmpfs

from loopchat.backends.replay import ReplayBackend
from loopchat.chat.export import (
    export_json,
    export_markdown,
    export_trace,
    import_trace,
    info_line,
    write_atomically,
)
from loopchat.engine.engine import Engine
from loopchat.event_json import event_from_json_dict
from loopchat.events import Finish, FinishReason, Message, RunDone, Start, Step
from loopchat.history.store import CUT, ConversationStore, StoreError
from loopchat.trace import CUT_SHORT, TraceWriter, read_trace

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def replies(engine: Engine) -> dict[str, list]:
    a = short_reply(engine, "Name a fruit.", 11, max_tokens=16)
    a2 = short_reply(engine, "Name a fruit.", 12, max_tokens=16)  # regenerated: a sibling
    history = (Message("user", "Name a fruit."), Message("assistant", a2[-1].text))
    b = short_reply(engine, "Why that one?", 13, *history, max_tokens=20)
    return {"a": a, "a2": a2, "b": b}


@pytest.fixture
def store(tmp_path: Path):
    with ConversationStore.open(tmp_path / "h.sqlite3") as s:
        yield s


def _conversation(store: ConversationStore, replies) -> tuple[int, dict[str, int]]:
    conv = store.new_conversation("Fruit talk", "SmolLM2", "/models/smol.gguf", 1234, SYSTEM.content)
    ids = {"u1": store.add_message(conv, None, "user", "Name a fruit.")}
    ids["a"] = store_reply(store, conv, ids["u1"], replies["a"])
    ids["a2"] = store_reply(store, conv, ids["u1"], replies["a2"], mode="blocking")
    ids["u2"] = store.add_message(conv, ids["a2"], "user", "Why that one?")
    ids["b"] = store_reply(store, conv, ids["u2"], replies["b"])
    return conv, ids


def test_markdown_is_the_path_with_info_lines(store, replies, tmp_path: Path) -> None:
    conv_id, ids = _conversation(store, replies)
    conv = store.load(conv_id)
    out = tmp_path / "talk.md"
    export_markdown(conv, out)
    text = out.read_text()
    assert text.startswith("# Fruit talk\n")
    assert SYSTEM.content in text and "SmolLM2" in text
    a2, b = conv.node(ids["a2"]), conv.node(ids["b"])
    for piece in ("Name a fruit.", "Why that one?", a2.content, b.content, info_line(a2), info_line(b)):
        assert piece in text
    # the info lines say what the chat says
    fb = replies["b"][-1]
    assert info_line(b).startswith("streamed · TTFT ") and f"{fb.completion_tokens} tokens" in info_line(b)
    assert "tok/s" in info_line(b)
    assert info_line(a2).startswith("blocking · whole reply shown after ")
    # another branch: the first reply
    export_markdown(conv, out, leaf_id=ids["a"])
    text = out.read_text()
    assert conv.node(ids["a"]).content in text and "Why that one?" not in text


def test_an_exported_trace_replays(store, replies, tmp_path: Path) -> None:
    conv_id, ids = _conversation(store, replies)
    conv = store.load(conv_id)
    out = tmp_path / "talk.jsonl"
    export_trace(conv, out)
    header, traced = read_trace(out)
    assert "cut_short" not in header and header["conversation"] == "Fruit talk"
    assert as_json([t.event for t in traced]) == as_json(replies["a2"] + replies["b"])
    times = [t.t_ms for t in traced]
    assert times == sorted(times)  # paced in order
    # `loopchat replay` plays it: its backend gives every event, each reply closed by RunDone
    backend = ReplayBackend(out, speed=0)
    got: list = []
    done = threading.Event()

    def sink(ev) -> None:
        got.append(ev)
        if isinstance(ev, RunDone) and ev.run_id == 2:
            done.set()

    backend.attach(sink)
    backend.start()
    assert done.wait(10)
    assert as_json([e for e in got if not isinstance(e, RunDone)]) == as_json(replies["a2"] + replies["b"])


def _trace_file(path: Path, replies_events: list[list], cut_last: int | None = None) -> None:
    with TraceWriter(path) as w:
        for i, events in enumerate(replies_events):
            if cut_last is not None and i == len(replies_events) - 1:
                events = events[:cut_last]
            for e in events:
                w.write(e)


def test_an_imported_trace_equals_the_original(store, replies, tmp_path: Path) -> None:
    original = tmp_path / "run.jsonl"
    _trace_file(original, [replies["a2"], replies["b"]])
    conv_id = import_trace(store, original)
    conv = store.load(conv_id)
    assert conv.summary.title == "Name a fruit." and conv.summary.replies == 2
    assert conv.system_prompt == SYSTEM.content and conv.summary.model_name == replies["b"][0].model_name
    assert [(n.role, n.content) for n in conv.path()] == [
        ("user", "Name a fruit."),
        ("assistant", replies["a2"][-1].text),
        ("user", "Why that one?"),
        ("assistant", replies["b"][-1].text),
    ]
    again = tmp_path / "again.jsonl"
    export_trace(conv, again)
    assert as_json([t.event for t in read_trace(again)[1]]) == as_json([t.event for t in read_trace(original)[1]])
    assert import_trace(store, original, title="mine") != conv_id
    assert store.list_conversations("mine")[0].title == "mine"


def test_a_cut_reply_exports_and_imports_as_cut(store, replies, tmp_path: Path) -> None:
    original = tmp_path / "cut.jsonl"
    _trace_file(original, [replies["a2"], replies["b"]], cut_last=8)  # Start, Prefill, 6 steps
    conv = store.load(import_trace(store, original))
    reply = conv.path()[-1]
    assert reply.status == "cut" and conv.summary.cut == 1
    finish = reply.events[-1]
    assert isinstance(finish, Finish) and finish.reason == FinishReason.ERROR and finish.error == CUT
    steps = [e for e in reply.events if isinstance(e, Step)]
    assert len(steps) == 6 and reply.content == "".join(s.text for s in steps) == finish.text
    assert "cut short" in info_line(reply)
    again = tmp_path / "again.jsonl"
    export_trace(conv, again)
    header, traced = read_trace(again)
    assert header["cut_short"] is True and traced[-1].synthetic and traced[-1].event.error == CUT_SHORT
    assert as_json([t.event for t in traced]) == as_json([t.event for t in read_trace(original)[1]])


def test_json_holds_the_whole_tree(store, replies, tmp_path: Path) -> None:
    conv_id, ids = _conversation(store, replies)
    out = tmp_path / "talk.json"
    export_json(store.load(conv_id), out)
    data = json.loads(out.read_text())
    assert data["format"] == "loopchat-conversation" and data["title"] == "Fruit talk"
    assert data["model_size"] == 1234 and data["system_prompt"] == SYSTEM.content
    nodes = {n["id"]: n for n in data["nodes"]}
    assert len(nodes) == 5 and nodes[ids["a"]]["parent_id"] == nodes[ids["a2"]]["parent_id"] == ids["u1"]
    assert nodes[ids["a2"]]["mode"] == "blocking" and nodes[ids["u1"]]["events"] == []
    for key in ("a", "a2", "b"):
        events = [event_from_json_dict(e) for e in nodes[ids[key]]["events"]]
        assert as_json(events) == as_json(replies[key])
        assert isinstance(events[0], Start)


def test_exports_are_atomic(store, replies, tmp_path: Path) -> None:
    conv = store.load(_conversation(store, replies)[0])
    # a folder that is not there: one line, nothing written
    with pytest.raises(StoreError) as err:
        export_markdown(conv, tmp_path / "nowhere" / "x.md")
    assert "cannot write" in str(err.value) and "\n" not in str(err.value)
    # a disk that fills up mid-write: the old file stays whole, no temporary file is left
    with tmpfs(tmp_path / "small", size="64k") as folder:
        target = folder / "talk.json"
        target.write_text("the previous export\n")
        big = conv
        big.nodes[0].content = "x" * 200_000
        with pytest.raises(StoreError) as err:
            export_json(big, target)
        assert "cannot write" in str(err.value)
        assert target.read_text() == "the previous export\n"
        assert [p.name for p in folder.iterdir()] == ["talk.json"]
        write_atomically(target, "new\n")
        assert target.read_text() == "new\n" and [p.name for p in folder.iterdir()] == ["talk.json"]
