"""`loopchat history`: list, show, export, import, delete, rename on real SQLite files;
one line and exit 2 for bad input; delete asks y/N on a terminal (a real pty)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from history_helpers import as_json

from loopchat.cli.main import main
from loopchat.history.store import ConversationStore
from loopchat.trace import read_trace

pytestmark = pytest.mark.server

TRACE = Path(__file__).parent / "data" / "reply.jsonl"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def store_path(tmp_path: Path, capsys) -> Path:
    path = tmp_path / "h.sqlite3"
    assert run(capsys, "history", "--store", str(path), "import", str(TRACE)) == (
        0,
        "1\n",
        f"{TRACE} stored as conversation 1\n",
    )
    assert run(capsys, "history", "import", str(TRACE), "--title", "Rainbow\tsecond", "--store", str(path))[:2] == (
        0,
        "2\n",
    )
    return path


def test_list_one_line_per_conversation(store_path: Path, capsys) -> None:
    code, out, err = run(capsys, "history", "--store", str(store_path), "list")
    assert code == 0 and err == ""
    lines = [line.split("\t") for line in out.splitlines()]
    assert [(f[0], f[2], f[3], f[4]) for f in lines] == [
        ("2", "smollm2-135m-instruct", "1", "Rainbow second"),  # newest first, one line each
        ("1", "smollm2-135m-instruct", "1", "Name three colours of the rainbow."),
    ]
    code, out, _ = run(capsys, "history", "--store", str(store_path), "list", "--json", "--search", "second")
    assert code == 0 and [(d["id"], d["replies"], d["cut"]) for d in json.loads(out)] == [(2, 1, 0)]
    assert run(capsys, "history", "--store", str(store_path), "list", "--search", "nothing-like-this")[:2] == (0, "")


def test_history_with_no_action_lists_the_conversations(store_path: Path, capsys) -> None:
    listed = run(capsys, "history", "--store", str(store_path), "list")
    assert listed[0] == 0 and len(listed[1].splitlines()) == 2
    assert run(capsys, "history", "--store", str(store_path)) == listed


def test_list_without_a_history_file_makes_none(tmp_path: Path, capsys) -> None:
    path = tmp_path / "none.sqlite3"
    assert run(capsys, "history", "--store", str(path), "list") == (0, "", "")
    code, _, err = run(capsys, "history", "--store", str(path), "show", "1")
    assert code == 2 and "no conversation 1" in err
    assert not path.exists()


def test_show_and_export(store_path: Path, tmp_path: Path, capsys) -> None:
    code, out, _ = run(capsys, "history", "--store", str(store_path), "show", "1")
    assert code == 0 and out.startswith("# Name three colours of the rainbow.\n") and "tok/s" in out
    md = tmp_path / "x.md"
    assert run(capsys, "history", "--store", str(store_path), "export", "1", "-o", str(md))[0] == 0
    assert md.read_text() == out
    trace = tmp_path / "x.jsonl"
    assert run(capsys, "history", "--store", str(store_path), "export", "1", "-o", str(trace))[0] == 0
    assert as_json([t.event for t in read_trace(trace)[1]]) == as_json([t.event for t in read_trace(TRACE)[1]])
    js = tmp_path / "x.data"
    assert run(capsys, "history", "--store", str(store_path), "export", "1", "--format", "json", "-o", str(js))[0] == 0
    assert json.loads(js.read_text())["title"] == "Name three colours of the rainbow."


@pytest.mark.parametrize(
    "argv, says",
    [
        (["show", "9"], "no conversation 9"),
        (["show", "abc"], "not a conversation id"),
        (["export", "1", "-o", "x.txt"], "--format md, trace or json"),
        (["export", "9", "-o", "x.md"], "no conversation 9"),
        (["import", "missing.jsonl"], "cannot read the trace file"),
        (["import", "h.sqlite3"], "not"),
        (["rename", "1", "  "], "a title cannot be empty"),
        (["delete", "9", "--yes"], "no conversation 9"),
        (["delete", "1"], "add --yes to delete from a script"),  # stdin is not a terminal here
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, says, store_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(store_path.parent)
    code, out, err = run(capsys, "history", "--store", str(store_path), *argv)
    assert code == 2 and out == "" and says in err
    assert err.count("\n") == 1 and err.startswith("loopchat: ")
    with ConversationStore.open(store_path) as store:
        assert len(store.list_conversations()) == 2


def test_a_damaged_store_is_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "h.sqlite3"
    path.write_bytes(b"not a database at all" * 100)
    code, out, err = run(capsys, "history", "--store", str(path), "list")
    assert code == 2 and out == "" and "is damaged" in err and err.count("\n") == 1
    assert path.read_bytes() == b"not a database at all" * 100


def test_rename_and_delete(store_path: Path, capsys) -> None:
    assert run(capsys, "history", "--store", str(store_path), "rename", "1", "My rainbow") == (0, "", "")
    assert run(capsys, "history", "--store", str(store_path), "delete", "2", "--yes") == (
        0,
        "",
        "deleted conversation 2\n",
    )
    code, out, _ = run(capsys, "history", "--store", str(store_path), "list")
    assert out.split("\t")[0] == "1" and out.rstrip().endswith("\tMy rainbow") and len(out.splitlines()) == 1


def _delete_on_a_terminal(path: Path, answer: bytes) -> tuple[int, str]:
    """`loopchat history delete 1` with its stdin on a real pty, answering `answer`."""
    master, slave = pty.openpty()
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "loopchat", "history", "--store", str(path), "delete", "1"],
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        os.write(master, answer)
        out, err = child.communicate(timeout=60)
    finally:
        os.close(master)
        os.close(slave)
    return child.returncode, err.decode()


def test_delete_asks_on_a_terminal(store_path: Path, capsys) -> None:
    code, err = _delete_on_a_terminal(store_path, b"n\n")
    assert code == 1 and "[y/N]" in err and "nothing deleted" in err
    with ConversationStore.open(store_path) as store:
        assert len(store.list_conversations()) == 2
    code, err = _delete_on_a_terminal(store_path, b"y\n")
    assert code == 0 and "deleted conversation 1" in err
    with ConversationStore.open(store_path) as store:
        assert [s.id for s in store.list_conversations()] == [2]
