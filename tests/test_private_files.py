"""The conversations are their owner's only, as shell history is: the data folder 0700,
the history file and its -wal/-shm, llama.log and the exports 0600, under an ordinary
umask (022); an existing history file others could read is made 0600 once, with a
one-line notice (`loopchat history` and the chat). Real files made by the real code in
temporary folders."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from tui_fixtures import FakeBackend, wait_for

from loopchat import paths
from loopchat.chat.export import export_markdown, import_trace
from loopchat.chat.prefs import Prefs, save_prefs
from loopchat.cli.main import main
from loopchat.engine.llama_log import route_llama_log
from loopchat.history.store import ConversationStore
from loopchat.tui.app import LoopChatApp

TRACE = Path(__file__).parent / "data" / "reply.jsonl"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(autouse=True)
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_data_folder_history_file_wal_shm_and_exports_are_private(tmp_path: Path) -> None:
    data = tmp_path / "new" / "data"
    with ConversationStore.open(data / "history.sqlite3") as store:
        conv_id = import_trace(store, TRACE)
        # the WAL and its index exist while a connection is open
        files = [data / "history.sqlite3", data / "history.sqlite3-wal", data / "history.sqlite3-shm"]
        assert [f.exists() for f in files] == [True, True, True]
        assert {f.name: oct(mode(f)) for f in files} == {f.name: "0o600" for f in files}
        export_markdown(store.load(conv_id), tmp_path / "talk.md")
    assert oct(mode(data)) == "0o700"
    assert oct(mode(tmp_path / "talk.md")) == "0o600"
    # the prefs file makes the same folder when it comes first
    other = tmp_path / "other"
    assert save_prefs(Prefs(), other / "prefs.json") is None
    assert oct(mode(other)) == "0o700"


def test_llama_log_is_private(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "llama.log"
    old = tmp_path / "old.log"
    old.write_text("an older log\n")
    os.chmod(old, 0o644)
    try:
        assert route_llama_log(log) == log
        assert oct(mode(log.parent)) == "0o700" and oct(mode(log)) == "0o600"
        assert route_llama_log(old) == old  # one made before: tightened
        assert oct(mode(old)) == "0o600" and old.read_text() == "an older log\n"
    finally:
        route_llama_log(paths.llama_log_path())


def _old_store(path: Path) -> None:
    """A history file as an older loopchat left it: -rw-r--r--."""
    with ConversationStore.open(path) as store:
        import_trace(store, TRACE)
    os.chmod(path, 0o644)
    for side in ("-wal", "-shm"):
        if Path(f"{path}{side}").exists():
            os.chmod(f"{path}{side}", 0o644)


def test_history_command_tightens_an_open_history_file_once(tmp_path: Path, capsys) -> None:
    path = tmp_path / "h.sqlite3"
    _old_store(path)
    assert main(["history", "--store", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("1\t")  # the list, as before
    assert err.count("\n") == 1 and err.startswith(f"loopchat: {path} was readable by other users")
    assert "-rw-r--r--" in err and "-rw-------" in err
    assert oct(mode(path)) == "0o600"
    assert main(["history", "--store", str(path), "list"]) == 0
    assert capsys.readouterr().err == ""  # said once


async def test_the_chat_tightens_an_open_history_file_once(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite3"
    _old_store(path)

    def notices(app) -> list[str]:
        return [str(n.message) for n in app.notices if n.title == "History"]

    for expected in (1, 0):
        app = LoopChatApp(FakeBackend(), prefs=Prefs(), prefs_path=tmp_path / "p.json", history_path=path)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda app=app: app.history is not None, 10, "history on")
            # the writer thread opens the file and hands its notice over: awaited
            await wait_for(pilot, lambda app=app, n=expected: len(notices(app)) >= n, 10, "the History notice")
            said = notices(app)
            assert len(said) == expected
            if expected:
                assert said[0].startswith(f"{path} was readable by other users")
        assert oct(mode(path)) == "0o600"
