"""The chat's history: replies stored as they run, the conversation list (Ctrl+O), a stored
conversation opened and continued, rename / delete / search, history off, a damaged store.

Real SQLite files in temporary folders; the real default model for what generates."""

from __future__ import annotations

import pytest
from tui_fixtures import FakeBackend, palette_pick, panel_text, wait_for, wait_run

from loopchat.chat.prefs import Prefs
from loopchat.chat.session import REBUILT_NOTE
from loopchat.cli.main import build_parser
from loopchat.events import FinishReason, Step
from loopchat.history.replays import shown_path
from loopchat.history.store import ConversationStore
from loopchat.settings import SamplingSettings
from loopchat.tui.app import LoopChatApp
from loopchat.tui.history_screen import ConfirmDelete, HistoryScreen, RenameScreen
from loopchat.tui.launch import create_app

SIZE = (120, 40)


@pytest.fixture(scope="module")
def backend(live_backend):
    return live_backend  # the session's (conftest.py): loaded once for every chat module


def live_app(backend, tmp_path, store, **prefs):
    prefs.setdefault("markdown", False)
    return create_app(
        backend=backend,
        prefs=Prefs(**prefs),
        prefs_path=tmp_path / "prefs.json",
        settings=SamplingSettings(seed=42, max_tokens=16, temperature=0.8),
        history=store,
    )


async def send(pilot, text: str) -> None:
    await wait_for(pilot, pilot.app.model_ready.is_set, 30, "the model")
    await pilot.press(*text, "enter")
    await wait_run(pilot)


def load_only(path):
    with ConversationStore.open(path) as store:
        (summary,) = store.list_conversations()
        return store.load(summary.id)


def notices(app, title: str) -> list[str]:
    return [n.message for n in app.notices if n.title == title]


@pytest.mark.model
async def test_stored_as_it_runs_then_opened_continued_and_stepped_through(backend, tmp_path) -> None:
    store = tmp_path / "history.sqlite3"
    app = live_app(backend, tmp_path, store)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Name a colour.")
        first = app.conversation.replies[0]
        await pilot.press("f5")  # a sibling reply of the same message
        await wait_run(pilot)
        await pilot.press("f9")  # the same tokens in the other mode: not part of the conversation
        await wait_run(pilot)
        second, replay = app.conversation.replies[1:]
        live_info = str(app.views[second].info_text())
        assert len(app.conversation.replies) == 3
        assert app.history.writer.flush(10)
        assert not app.history_error
    conv = load_only(store)
    assert conv.summary.title == "Name a colour."
    assert conv.summary.model_name == backend.name and conv.model_path and conv.model_size > 0
    assert conv.summary.replies == 3 and conv.summary.cut == 0  # F9's replay is stored beside its reply
    user, r1, r2, r3 = conv.nodes
    assert (user.role, user.content, user.parent_id) == ("user", "Name a colour.", None)
    assert r1.parent_id == r2.parent_id == r3.parent_id == user.id  # F5 and F9: siblings
    for node, rec in ((r1, first), (r2, second), (r3, replay)):
        steps = [e for e in node.events if isinstance(e, Step)]
        assert steps == rec.steps  # every step, as the chat received it
        assert node.events[0] == rec.start and node.events[-1] == rec.finish and node.content == rec.finish.text
    assert conv.path()[-1].id == r3.id  # the store's most recent leaf: the replay, which the chat
    assert [n.id for n in shown_path(conv)] == [user.id, r2.id]  # shows beside r2, its line's reply
    from loopchat.chat.export import to_markdown

    md = to_markdown(conv)  # `loopchat history show`: the line, so r2 (streamed), not the replay
    assert "*streamed" in md and "*blocking" not in md and md.count("## Assistant") == 1

    # a new app (a new start): Ctrl+O lists it; Enter opens it
    app = live_app(backend, tmp_path, store)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 5, "the list")
        screen = app.screen
        assert [s.id for s in screen.summaries] == [conv.summary.id]
        label = str(screen.options.get_option_at_index(0).prompt)
        assert "Name a colour." in label and backend.name in label and "3 replies" in label
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, HistoryScreen), 5, "the list to close")
        # the stored path: the message and the F5 reply, with its info line; the first
        # reply is its other version, hidden
        older, rec, again = app.conversation.replies
        assert older.hidden and not rec.hidden and older.siblings is rec.siblings
        assert older.steps == first.steps and rec.steps == second.steps and rec.finish == second.finish
        assert (again.number, again.replay_of, again.steps, again.hidden) == (3, 2, replay.steps, False)
        view, replay_view = app.transcript.reply_views()  # the replay after the reply, as live
        assert replay_view.record is again
        assert str(view.info_text()) == live_info  # as it was shown live
        assert view.record is rec and "version 2/2" in view.line(1).text
        assert [m.content for m in app.conversation.turns] == ["Name a colour.", second.finish.text]
        # Alt+PgUp shows the first version: the conversation goes on from it; Alt+PgDn back
        await pilot.press("alt+pageup")
        (view,) = app.transcript.reply_views()
        assert view.record is older and "version 1/2" in view.line(1).text
        assert [m.content for m in app.conversation.turns] == ["Name a colour.", first.finish.text]
        await pilot.press("alt+pagedown")
        view, _ = app.transcript.reply_views()
        assert view.record is rec and [m.content for m in app.conversation.turns][-1] == second.finish.text
        # the token cursor steps through the stored reply: the panel shows that step
        await pilot.press("alt+left")  # (the last reply shown: the replay, stored too)
        last = [s for s in again.steps if s.text and not s.is_stop][-1]
        assert app.selection == (again.number, last.index)
        assert f"Forward pass {last.index + 1}" in panel_text(app)
        await pilot.press("escape")
        # a click on a stored token (the body's first character): the panel shows its step
        t = app.transcript
        first_shown = next(s for s in rec.steps if s.text.strip())
        y = t._starts[t.blocks.index(view)] + 2 - int(t.scroll_y)  # the body's first line
        assert view.line(2).text[2:].startswith(first_shown.text.lstrip()[:1])
        await pilot.click(t, offset=(3, y))  # 3: the transcript's padding and the gutter "│ "
        await pilot.pause()
        assert app.selection == (rec.number, first_shown.index)
        shown = panel_text(app).replace("\n", " ")
        assert f"Forward pass {first_shown.index + 1}" in shown and f"selected  token of reply {rec.number}" in shown
        await pilot.press("escape")
        # continuing: the stored turns go with the next message; the prefill evaluates them all
        await send(pilot, "Another one?")
        new = app.conversation.replies[-1]
        assert [m.content for m in new.messages if m.role != "system"] == [
            "Name a colour.",
            second.finish.text,
            "Another one?",
        ]
        assert new.prefill.reused_tokens == 0 and new.prefill.evaluated_tokens == new.prefill.prompt_tokens
        assert REBUILT_NOTE in str(app.transcript.reply_views()[-1].info_text())
        await send(pilot, "Thanks.")  # the one after uses the cache again
        assert app.conversation.replies[-1].prefill.reused_tokens > 0
        assert app.conversation.replies[-1].note is None
        assert app.history.writer.flush(10)
    conv = load_only(store)
    assert conv.summary.replies == 5
    path = conv.path()
    assert [n.content for n in path if n.role == "user"] == ["Name a colour.", "Another one?", "Thanks."]
    assert path[1].id == r2.id  # appended after the reply that was shown


@pytest.mark.slow
async def test_list_search_rename_and_delete_with_confirmation(tmp_path) -> None:
    store = tmp_path / "h.sqlite3"
    with ConversationStore.open(store) as s:
        ids = {}
        for title, text in [
            ("Dragons", "a story about a dragon"),
            ("Cooking", "how to cook rice"),
            ("Sea poem", "write a poem about the sea"),
        ]:
            ids[title] = s.new_conversation(title, "tiny-model")
            s.add_message(ids[title], None, "user", text)
    app = LoopChatApp(FakeBackend(), prefs=Prefs(), prefs_path=tmp_path / "p.json", history_path=store)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 5, "the list")
        screen = app.screen
        assert [s.title for s in screen.summaries] == ["Sea poem", "Cooking", "Dragons"]  # newest first
        await pilot.press(*"rice")  # the search box: over the messages' text
        assert [s.title for s in screen.summaries] == ["Cooking"]
        await pilot.press(*" nothing")
        assert screen.summaries == [] and "No conversation matches" in str(screen.options.get_option_at_index(0).prompt)
        await pilot.press("ctrl+r", "ctrl+d")  # nothing to act on: each says so (they did nothing, silently)
        assert app.screen is screen
        said = [str(n.message) for n in app.notices]
        assert [m for m in said if m.startswith("Nothing to")] == [
            "Nothing to rename: no conversation matches the search",
            "Nothing to delete: no conversation matches the search",
        ]
        for _ in " nothing":
            await pilot.press("backspace")
        assert [s.title for s in screen.summaries] == ["Cooking"]
        # rename: an input with the old title; Enter keeps the new one
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: isinstance(app.screen, RenameScreen), 5, "the rename box")
        await pilot.press("ctrl+u", *"Rice, properly", "enter")
        await wait_for(pilot, lambda: app.screen is screen, 5, "back to the list")
        assert screen.summaries[0].title == "Rice, properly"
        # delete: n keeps it, y deletes it
        await pilot.press("ctrl+d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDelete), 5, "the confirmation")
        await pilot.press("n")
        await wait_for(pilot, lambda: app.screen is screen, 5, "back to the list")
        assert len(screen.summaries) == 1
        await pilot.press("ctrl+d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDelete), 5, "the confirmation")
        await pilot.press("y")
        await wait_for(pilot, lambda: app.screen is screen, 5, "back to the list")
        assert screen.summaries == []
        await pilot.press("escape")
        assert not isinstance(app.screen, HistoryScreen)
        assert app.history.writer.flush(10)
    with ConversationStore.open(store) as s:
        assert sorted(x.title for x in s.list_conversations()) == ["Dragons", "Sea poem"]
        with pytest.raises(KeyError):
            s.load(ids["Cooking"])


async def test_the_command_palette_opens_the_list(tmp_path) -> None:
    app = LoopChatApp(FakeBackend(), prefs=Prefs(), prefs_path=tmp_path / "p.json", history_path=tmp_path / "h.sqlite3")
    async with app.run_test(size=SIZE) as pilot:
        await palette_pick(pilot, "Conversations")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 5, "the list")
        assert "No conversation stored yet" in str(app.screen.options.get_option_at_index(0).prompt)


@pytest.mark.model
async def test_no_history_and_the_pref_off_keep_nothing(backend, tmp_path, monkeypatch) -> None:
    data = tmp_path / "data"
    monkeypatch.setenv("LOOPCHAT_DATA_DIR", str(data))
    assert build_parser().parse_args(["--no-history"]).no_history
    assert not build_parser().parse_args([]).no_history
    for app in (
        create_app(backend=backend, prefs=Prefs(), prefs_path=tmp_path / "p.json", history=False),  # --no-history
        create_app(backend=backend, prefs=Prefs(history=False), prefs_path=tmp_path / "p.json"),  # the pref
    ):
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, "Hi")
            assert app.conversation.replies[0].finish.text and app.history is None
            await pilot.press("ctrl+o")
            assert not isinstance(app.screen, HistoryScreen)
            assert any("History is off" in n.message for n in app.notices)
    assert not data.exists() or not any(data.iterdir())  # no file created or written
    # the same app with history on (the default) writes to the data folder
    app = create_app(backend=backend, prefs=Prefs(), prefs_path=tmp_path / "p.json")
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Hi")
    assert (data / "history.sqlite3").exists()


async def test_the_history_toggle_in_the_palette(tmp_path) -> None:
    store = tmp_path / "h.sqlite3"
    app = LoopChatApp(FakeBackend(), prefs=Prefs(), prefs_path=tmp_path / "p.json", history_path=store)
    async with app.run_test(size=SIZE) as pilot:
        app.action_toggle_history()
        assert app.history is None and app.prefs.history is False
        await pilot.press(*"not kept", "enter")
        await wait_run(pilot)
        app.action_toggle_history()
        assert app.history is not None
        await pilot.press(*"kept", "enter")
        await wait_run(pilot)
    with ConversationStore.open(store) as s:
        assert [x.title for x in s.list_conversations()] == ["kept"]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "newer"])
async def test_a_damaged_store_gives_one_notice_and_is_never_written(tmp_path, damage) -> None:
    store = tmp_path / "h.sqlite3"
    if damage == "garbage":
        store.write_bytes(b"this is not a database at all\n" * 200)
    else:
        with ConversationStore.open(store) as s:
            s.add_message(s.new_conversation("old", "m"), None, "user", "kept as it is")
        raw = store.read_bytes()
        if damage == "truncated":
            store.write_bytes(raw[: len(raw) // 2])
        else:
            import sqlite3

            con = sqlite3.connect(store)
            con.execute("PRAGMA user_version = 99")
            con.commit()
            con.close()
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    app = LoopChatApp(FakeBackend(), prefs=Prefs(), prefs_path=tmp_path / "p.json", history_path=store)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.history_error is not None, 10, "the store's notice")
        assert app.history is None
        await pilot.press(*"Hello", "enter")  # the chat goes on
        await wait_run(pilot)
        assert app.conversation.replies[0].finish.reason == FinishReason.STOP
        await pilot.press("ctrl+o")
        assert not isinstance(app.screen, HistoryScreen)
        (line,) = notices(app, "History off")  # one notice, one line
        assert "\n" not in line and str(store) in line
        assert any(n.message.startswith("History is off: ") for n in app.notices)
    assert store.read_bytes() == before["h.sqlite3"]  # untouched
    wal = tmp_path / "h.sqlite3-wal"  # a reader of a WAL file (the version check) may leave an empty one
    assert not wal.exists() or wal.read_bytes() == before.get(wal.name, b"")


@pytest.mark.slow
async def test_a_write_failure_mid_session_gives_one_notice_and_the_chat_goes_on(tmp_path) -> None:
    """Another process holds the file's write lock for longer than the store waits."""
    import sqlite3

    store = tmp_path / "h.sqlite3"
    app = LoopChatApp(FakeBackend(), prefs=Prefs(), prefs_path=tmp_path / "p.json", history_path=store)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*"first", "enter")
        await wait_run(pilot)
        assert app.history.writer.flush(10)
        holder = sqlite3.connect(store, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            await pilot.press(*"second", "enter")
            await wait_run(pilot)
            await wait_for(pilot, lambda: app.history_error is not None, 30, "the writer's notice")
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert app.history is None
        await pilot.press(*"third", "enter")  # the chat goes on, without history
        await wait_run(pilot)
        assert len(app.conversation.replies) == 3
        (line,) = notices(app, "History off")
        assert "\n" not in line and "history not saved" in line


@pytest.mark.model
async def test_a_reply_left_by_ctrl_n_is_stored_as_stopped_and_says_why_once(backend, tmp_path) -> None:
    from tui_fixtures import StepGate

    from loopchat.chat.export import info_line
    from loopchat.chat.history_recorder import LEFT_UNFINISHED

    store = tmp_path / "history.sqlite3"
    app = live_app(backend, tmp_path, store)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        gate = StepGate(app, after=3)
        await pilot.press(*"Tell me a story.", "enter")
        await wait_for(pilot, lambda: gate.holding and app.steps_seen >= 3, 30, "the reply under way")
        await pilot.press("ctrl+n")  # a new conversation, the reply still running
        gate.release()
        await wait_for(pilot, lambda: not app.generating, 30, "the reply to stop")
        assert app.history.writer.flush(10)
    reply = load_only(store).path()[-1]
    finish = reply.events[-1]
    assert finish.reason == FinishReason.CANCELLED and finish.error == LEFT_UNFINISHED
    line = info_line(reply)
    assert f"stopped (cancelled): {LEFT_UNFINISHED}" in line and line.count("stopped") == 1, line


@pytest.mark.model
async def test_reply_numbers_are_the_same_when_the_conversation_is_reopened(backend, tmp_path) -> None:
    """F9's replay was numbered live but not stored: the reply after it was reply 3 live
    and reply 2 reopened. The replay is stored beside the reply it replays, and shown
    after it again, under its number."""
    store = tmp_path / "history.sqlite3"
    app = live_app(backend, tmp_path, store)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Name a colour.")
        await pilot.press("f9")
        await wait_run(pilot)
        await send(pilot, "Another one?")
        live = [(r.number, r.replay_of, r.mode, r.text) for r in app.conversation.replies]
        titles = [v.line(1).text for v in app.transcript.reply_views()]
        assert [n for n, *_ in live] == [1, 2, 3] and live[1][1] == 1
        assert app.history.writer.flush(10)
    app = live_app(backend, tmp_path, store)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 5, "the list")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, HistoryScreen), 5, "the list to close")
        assert [(r.number, r.replay_of, r.mode, r.text) for r in app.conversation.replies] == live
        assert [v.line(1).text for v in app.transcript.reply_views()] == titles
        assert [m.content for m in app.conversation.turns] == ["Name a colour.", live[0][3], "Another one?", live[2][3]]
