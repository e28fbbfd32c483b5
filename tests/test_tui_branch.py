"""Branches in the chat on the real default model: Ctrl+R at a token (another candidate,
or a new draw), the versions of a reply (Alt+PgUp / Alt+PgDn), F5 among them, and what the
conversation goes on from."""

from __future__ import annotations

import pytest
from tui_fixtures import FakeBackend, StepGate, document_settled, reply_to, wait_for, wait_run

from loopchat.chat.prefs import Prefs
from loopchat.settings import SamplingSettings
from loopchat.tui.app import LoopChatApp
from loopchat.tui.branch_picker import BranchPicker, branch_choices
from loopchat.tui.launch import create_app

pytestmark = pytest.mark.model

SIZE = (120, 40)


@pytest.fixture(scope="module")
def backend(live_backend):
    return live_backend  # the session's (conftest.py): loaded once for every chat module


def make_app(backend, tmp_path):
    return create_app(
        backend=backend,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "prefs.json",
        settings=SamplingSettings(seed=5, max_tokens=20, temperature=0.8),
        history=False,
    )


def notices(app) -> list[str]:
    return [str(n.message) for n in app.notices]


def title(app) -> str:
    """The title of the first turn's reply view."""
    return app.transcript.reply_views()[0].line(1).text


async def select_back(pilot, n: int) -> tuple[int, int]:
    """The token cursor n tokens back from the end of the last reply."""
    for _ in range(n):
        await pilot.press("alt+left")
    assert pilot.app.selection is not None
    return pilot.app.selection


async def first_reply_selected(pilot, question: str, back: int):
    """Once the model is loaded: `question` asked, its reply (the first), and the token
    cursor `back` tokens from its end (reply number, step index)."""
    app = pilot.app
    await wait_for(pilot, app.model_ready.is_set, 30, "the model")
    await reply_to(pilot, question)
    (first,) = app.conversation.replies
    reply, at = await select_back(pilot, back)
    return first, reply, at


async def open_stored(pilot) -> None:
    """Once the model is loaded: Ctrl+O, Enter on the newest stored conversation."""
    from loopchat.tui.history_screen import HistoryScreen

    app = pilot.app
    await wait_for(pilot, app.model_ready.is_set, 30, "the model")
    await pilot.press("ctrl+o")
    await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 5, "the list")
    await pilot.press("enter")
    await wait_for(pilot, lambda: not isinstance(app.screen, HistoryScreen), 5, "the list to close")


async def make_branch(pilot, reply: int, at: int, key: str):
    """Select token `at` of reply `reply` (as a click does), Ctrl+R, `key` in the picker
    (a candidate's row, or 0: a new draw); the new version when it has run."""
    app = pilot.app
    app.action_select_token(reply, at)
    await pilot.press("ctrl+r")
    await wait_for(pilot, lambda: isinstance(app.screen, BranchPicker), 5, "the branch picker")
    await pilot.press(key)
    await wait_run(pilot)
    return app.conversation.replies[-1]


async def test_branch_at_a_token_with_another_candidate_then_switch_versions(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await pilot.press("ctrl+r")  # nothing selected yet: it says what to do
        assert any("Select a token" in n for n in notices(app))
        await reply_to(pilot, "Name three animals that live in the sea.")
        (first,) = app.conversation.replies
        reply, at = await select_back(pilot, 6)
        assert reply == first.number and at > 0
        drawn = first.steps[at]
        row, other = next((i + 1, c) for i, c in enumerate(drawn.raw_top) if c.token_id != drawn.token_id)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchPicker), 5, "the branch picker")
        await pilot.press(str(row))
        await wait_run(pilot)
        branch = app.conversation.replies[-1]
        # the reply up to the token is the same passes; the token there is the one picked
        assert branch.steps[:at] == first.steps[:at] and all(a is b for a, b in zip(branch.steps, first.steps[:at]))
        mine = branch.steps[at]
        assert mine.token_id == other.token_id and mine.chosen_by == "hand"
        assert mine.raw_top == drawn.raw_top  # the same die: the same logits at that point
        # the KV cache held the prompt and the reply: one token evaluated (the one before the branch point)
        assert branch.prefill.evaluated_tokens == 1
        assert branch.prefill.reused_tokens == branch.prefill.prompt_tokens - 1
        assert branch.start.reply_prefix == tuple(s.token_id for s in first.steps[:at])
        prefix_text = "".join(s.text for s in first.steps[:at])
        assert branch.text == prefix_text + branch.finish.text and branch.text.startswith(prefix_text)
        # shown in the first one's place, as version 2/2, with where it branched and the reuse
        assert "version 2/2" in title(app) and f"from reply 1 at token {at + 1}" in title(app)
        (view,) = app.transcript.reply_views()
        assert view.record is branch and view.body_text().startswith(prefix_text)
        info = str(view.info_text())
        assert f"{branch.prefill.reused_tokens} tokens reused from the KV cache, 1 evaluated" in info
        assert "other versions: Alt+PgUp / Alt+PgDn" in info
        assert app.conversation.turns[-1].content == branch.text
        # Alt+PgUp / Alt+PgDn: the versions, and the conversation goes on from the one shown
        await pilot.press("alt+pageup")
        assert "version 1/2" in title(app) and app.transcript.reply_views()[0].record is first
        assert app.session.shown_step(None)[0] is first  # the panel shows the version shown
        assert app.conversation.turns[-1].content == first.text and len(app.conversation.turns) == 2
        await pilot.press("alt+pagedown")
        assert "version 2/2" in title(app) and app.conversation.turns[-1].content == branch.text
        # F9 replays the branch in the other mode: its prefix, its picked token, the same tokens after
        await pilot.press("f9")
        await wait_run(pilot)
        replay = app.conversation.replies[-1]
        assert replay.replay_of == branch.number and replay.text == branch.text
        assert [s.token_id for s in replay.steps] == [s.token_id for s in branch.steps]
        assert replay.steps[at].chosen_by == "hand" and replay.prefill.evaluated_tokens == 1
        # a new draw at a token of the branch (as a click on it selects it): a third
        # version, rolled from the same die
        at2 = [s.index for s in branch.steps if s.text and not s.is_stop][-2]
        assert at2 > at
        third = await make_branch(pilot, branch.number, at2, "0")
        assert third.branch_from == branch.number and third.steps[at2].chosen_by == "sampled"
        assert third.steps[at2].raw_top == branch.steps[at2].raw_top
        assert third.prefill.evaluated_tokens == 1 and "version 3/3" in title(app)
        # F5 makes a fourth version of the same turn
        await pilot.press("f5")
        await wait_run(pilot)
        assert len(first.siblings) == 4 and "version 4/4" in title(app)
        # the next message goes on from the version shown
        await pilot.press("alt+pageup", "alt+pageup")  # version 2: the first branch
        assert "version 2/4" in title(app)
        await reply_to(pilot, "Which one is the biggest?")
        last = app.conversation.replies[-1]
        assert [m.content for m in last.messages if m.role == "assistant"] == [branch.text]
        # versions belong to the last turn's reply only
        await pilot.press("alt+pageup")
        assert any("one version" in n for n in notices(app))


async def test_branch_is_refused_while_generating_and_for_a_backend_that_cannot(tmp_path) -> None:
    app = LoopChatApp(FakeBackend(), prefs=Prefs(), prefs_path=tmp_path / "p.json")
    async with app.run_test(size=SIZE) as pilot:
        await reply_to(pilot, "hi")
        await pilot.press("alt+left", "ctrl+r")
        assert "The fake backend cannot branch" in notices(app)
        assert not isinstance(app.screen, BranchPicker)


async def test_the_picker_lists_the_pass_and_esc_cancels(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        rec, reply, at = await first_reply_selected(pilot, "Say hello.", 1)
        rows = branch_choices(rec.steps[at], app.session.settings)
        assert rows[0][0].token_id is None and "roll again" in rows[0][1]
        assert [c.token_id for c, _ in rows[1:]] == [c.token_id for c in rec.steps[at].raw_top]
        assert sum("(drawn)" in text for _, text in rows) == (
            rec.steps[at].token_id in [c.token_id for c in rec.steps[at].raw_top]
        )
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchPicker), 5, "the branch picker")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, BranchPicker), 5, "the picker to close")
        assert len(app.conversation.replies) == 1 and not app.generating
        # while a reply runs, Ctrl+R says to stop it first
        gate = StepGate(app, after=2)
        await pilot.press(*"Again.", "enter")
        await wait_for(pilot, lambda: gate.holding, 30, "the reply to be held mid-way")
        assert app.generating
        app.action_select_token(reply, at)
        await pilot.press("ctrl+r")
        assert any("Still generating" in n for n in notices(app))
        assert not isinstance(app.screen, BranchPicker)
        gate.release()
        await wait_run(pilot)


async def test_slash_in_the_picker_branches_with_any_token_of_the_vocabulary(backend, tmp_path) -> None:
    from textual.widgets import Input, OptionList

    from loopchat.tui.step_mode import TokenSearch

    app = make_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        first, reply, at = await first_reply_selected(pilot, "Name three animals that live in the sea.", 4)
        listed = {c.token_id for c in first.steps[at].raw_top}
        vocab = backend.vocabulary()
        word = " penguin" if " penguin" in vocab else " whale"
        tid = vocab.index(word)
        assert tid not in listed  # a token the picker's rows do not offer
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchPicker), 5, "the branch picker")
        await pilot.press("slash")
        await wait_for(pilot, lambda: isinstance(app.screen, TokenSearch), 5, "the search")
        app.screen.query_one(Input).value = word
        search = app.screen
        await wait_for(pilot, lambda: search.results and search.results[0] == tid, 5, "the token found")
        row = str(search.query_one(OptionList).get_option_at_index(0).prompt)
        # not among the pass's stored candidates: its raw figure not given ("–"); after sampling "cut"
        # when the stored list holds every token sampling kept (then it was cut), else not given either
        step = first.steps[at]
        complete = step.candidates_kept is not None and step.candidates_kept <= len(step.sampled_top)
        assert str(tid) in row and row.count("–") == (1 if complete else 2) and ("cut" in row) == complete, row
        await pilot.press("enter")
        await wait_run(pilot)
        branch = app.conversation.replies[-1]
        assert branch is not first and branch.steps[at].token_id == tid and branch.steps[at].chosen_by == "hand"
        assert branch.steps[:at] == first.steps[:at] and branch.prefill.evaluated_tokens == 1
        assert branch.steps[at].text == word and "version 2/2" in title(app)


async def test_a_branch_is_stored_beside_its_reply_and_reopened_as_a_version(backend, tmp_path) -> None:
    from loopchat.events import Step
    from loopchat.history.store import ConversationStore

    store = tmp_path / "h.sqlite3"

    def open_app():
        return create_app(
            backend=backend,
            prefs=Prefs(markdown=False),
            prefs_path=tmp_path / "prefs.json",
            settings=SamplingSettings(seed=5, max_tokens=24, temperature=0.8),
            history=store,
        )

    app = open_app()
    async with app.run_test(size=SIZE) as pilot:
        first, _, at = await first_reply_selected(pilot, "Name a colour and say why you like it.", 4)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchPicker), 5, "the branch picker")
        await pilot.press("0")
        await wait_run(pilot)
        branch = app.conversation.replies[-1]
        assert app.history.writer.flush(10)
    with ConversationStore.open(store) as s:
        (summary,) = s.list_conversations()
        conv = s.load(summary.id)
    user, r1, r2 = conv.nodes
    assert r1.parent_id == r2.parent_id == user.id  # versions of one turn: siblings
    assert r2.content == branch.text and r1.content == first.text
    assert [e for e in r2.events if isinstance(e, Step)] == branch.steps  # its prefix's steps too
    # reopened: both versions, the branch shown, the same text
    app = open_app()
    async with app.run_test(size=SIZE) as pilot:
        await open_stored(pilot)
        older, shown = app.conversation.replies
        assert older.hidden and shown.text == branch.text and shown.prefix_len == at
        assert "version 2/2" in title(app) and app.conversation.turns[-1].content == branch.text
        assert f"from reply {older.number} at token {at + 1}" in title(app)
        await pilot.press("alt+pageup")
        assert app.conversation.turns[-1].content == first.text


async def test_the_document_view_of_a_branch_shows_its_prefix_once(backend, tmp_path) -> None:
    """The session's branch of a reply, then the document view's token list: the prompt,
    the reply's tokens before the branch point (as steps, once), then the branch's own."""
    app = make_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await reply_to(pilot, "Name a bird.")
        (first,) = app.conversation.replies
        at = max(1, len(first.steps) // 2)
        branch = await make_branch(pilot, first.number, at, "0")
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        doc = app.document
        ids = [t.token_id for t in doc.doc.tokens[doc.reply_start :]]
        assert ids == [s.token_id for s in branch.steps]
        assert ids[:at] == list(branch.start.reply_prefix)


async def test_a_branch_at_an_earlier_turn_sets_the_later_turns_aside_with_its_version(backend, tmp_path) -> None:
    from loopchat.history.store import ConversationStore

    store = tmp_path / "h.sqlite3"
    app = create_app(
        backend=backend,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "prefs.json",
        settings=SamplingSettings(seed=11, max_tokens=16, temperature=0.8),
        history=store,
    )
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await reply_to(pilot, "Name a planet.")
        await reply_to(pilot, "How far is it from the sun?")
        first, second = app.conversation.replies
        turns_before = [m.content for m in app.conversation.turns]
        # a token of the first reply: Ctrl+R, a new draw there
        at = max(1, len([s for s in first.steps if not s.is_stop]) // 2)
        branch = await make_branch(pilot, first.number, at, "0")
        assert branch.siblings is first.siblings and branch.turn_base == 0
        # the second turn was built on the first version: it is set aside with it
        assert [v.record for v in app.transcript.reply_views()] == [branch]
        assert [m.content for m in app.conversation.turns] == ["Name a planet.", branch.text]
        assert second.hidden and not second.in_history
        # Alt+PgUp on the (only) turn: the first version comes back with the turn built on it
        await pilot.press("alt+pageup")
        assert [v.record for v in app.transcript.reply_views()] == [first, second]
        assert [m.content for m in app.conversation.turns] == turns_before
        assert not second.hidden and second.in_history
        # the first turn's versions, from a selected token of it, while a later turn is shown
        app.action_select_token(first.number, at)
        await pilot.press("alt+pagedown")
        assert [v.record for v in app.transcript.reply_views()] == [branch]
        # the next message goes on from the branch
        await reply_to(pilot, "Is it big?")
        third = app.conversation.replies[-1]
        assert [m.content for m in third.messages if m.role != "system"] == [
            "Name a planet.",
            branch.text,
            "Is it big?",
        ]
        assert app.history.writer.flush(10)
    with ConversationStore.open(store) as s:
        (summary,) = s.list_conversations()
        conv = s.load(summary.id)
    # the store's tree: the first message with two replies; one goes on to the second
    # question, the branch to the third
    by_id = {n.id: n for n in conv.nodes}
    path = conv.path()
    assert [n.content for n in path if n.role == "user"] == ["Name a planet.", "Is it big?"]
    assert path[1].content == branch.text
    other = [n for n in conv.nodes if n.role == "user" and n.content == "How far is it from the sun?"]
    assert len(other) == 1 and by_id[other[0].parent_id].content == first.text
    # reopened: the branch's path; the first version, shown again, brings back its turn
    app = create_app(
        backend=backend,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "prefs.json",
        settings=SamplingSettings(seed=11, max_tokens=16, temperature=0.8),
        history=store,
    )
    async with app.run_test(size=SIZE) as pilot:
        await open_stored(pilot)
        views = app.transcript.reply_views()
        assert [v.record.text for v in views] == [branch.text, third.text]
        app.action_select_token(views[0].record.number, at)
        await pilot.press("alt+pageup")
        views = app.transcript.reply_views()
        assert [v.record.text for v in views] == [first.text, second.text]
        assert [m.content for m in app.conversation.turns] == turns_before
        await reply_to(pilot, "And its moons?")  # goes on from the stored reply it hangs from
        assert app.history.writer.flush(10)
    with ConversationStore.open(store) as s:
        conv = s.load(summary.id)
    path = conv.path()
    assert [n.content for n in path if n.role == "user"] == [
        "Name a planet.",
        "How far is it from the sun?",
        "And its moons?",
    ]
    assert path[3].content == second.text


async def test_compare_counts_a_branchs_own_run(backend, tmp_path) -> None:
    """A branch and the reply it continues, side by side (Ctrl+G): the branch's passes
    and tokens are its run's, not its prefix's again."""
    from loopchat.chat.reply_stats import reply_stats

    app = make_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await reply_to(pilot, "Name a fish.")
        (first,) = app.conversation.replies
        at = max(1, len([s for s in first.steps if not s.is_stop]) // 2)
        branch = await make_branch(pilot, first.number, at, "0")
        stats = reply_stats(branch)
        own = branch.steps[at:]
        assert stats.steps == len(own) and stats.passes == branch.prefill.batches + len(own) - 1
        assert stats.tokens == branch.finish.completion_tokens == sum(1 for s in own if not s.is_stop)
        assert stats.text == branch.text
        await pilot.press("ctrl+g")  # the two versions, side by side
        await pilot.pause()
        from loopchat.tui.compare_view import CompareScreen

        assert isinstance(app.screen, CompareScreen)


async def test_a_branch_made_without_step_mode_has_no_step_mode_stop_in_its_first_token(backend, tmp_path) -> None:
    """The panel said "first token 157 ms (incl. step-mode stop)" for a Ctrl+R branch at
    the first token: the token given with the request was taken for one picked in step
    mode. The reply's own info line says nothing of a stop either."""
    from tui_fixtures import panel_text

    app = make_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await reply_to(pilot, "Name a colour.")
        (first,) = app.conversation.replies
        branch = await make_branch(pilot, first.number, 0, "2")
        assert branch.steps[0].chosen_by == "hand" and not branch.stepped
        await wait_for(pilot, lambda: app.session.shown_step(None)[0] is branch, 5, "the panel on the branch")
        await pilot.pause()
        text = panel_text(app)
        first_token = next(line for line in text.splitlines() if "first token" in line)
        assert "ms" in first_token and "step-mode" not in first_token, first_token
        assert "step mode" not in str(app.transcript.reply_views()[0].info_text())
