"""Completion mode in the chat (issue 13 item 4): the user writes a document and the model
continues it with no chat template; Ctrl+L switches; the transcript shows one document;
stored and reopened; a model with no chat template opens in it.

The real default model (and Gemma 3 270M base, which has no chat template) with Pilot."""

from __future__ import annotations

import pytest
from tui_fixtures import document_settled, drawn, fake_app, palette_pick, panel_text, wait_for, wait_run

from loopchat.chat.prefs import Prefs
from loopchat.engine.chat_prompt import NO_TEMPLATE_NOTE
from loopchat.events import DOCUMENT, Message
from loopchat.history.store import ConversationStore
from loopchat.settings import SamplingSettings
from loopchat.tui.document_block import DocumentBlock
from loopchat.tui.document_view import CONTROL
from loopchat.tui.history_screen import HistoryScreen
from loopchat.tui.launch import create_app

pytestmark = pytest.mark.model

SIZE = (120, 40)
TEXT = "The recipe for bread: flour, water,"


@pytest.fixture(scope="module")
def backend(live_backend):
    return live_backend  # the session's (conftest.py): loaded once for every chat module


def live_app(backend, tmp_path, history=False):
    return create_app(
        backend=backend,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "prefs.json",
        settings=SamplingSettings(seed=7, max_tokens=12, temperature=0.8),
        history=history,
    )


def the_document(app) -> DocumentBlock:
    blocks = app.transcript.blocks
    assert len(blocks) == 1 and isinstance(blocks[0], DocumentBlock), blocks
    return blocks[0]


async def first_continuation(pilot) -> None:
    """Once the model is loaded: Ctrl+L (completion mode), TEXT sent, its continuation run."""
    app = pilot.app
    await wait_for(pilot, app.model_ready.is_set, 30, "the model")
    await pilot.press("ctrl+l")
    app.prompt.value = TEXT
    await pilot.press("enter")
    await wait_run(pilot)


async def test_completion_mode_continues_one_document_with_no_template(backend, tmp_path) -> None:
    app = live_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        assert not app.session.completion and "completion" not in app.sub_title  # SmolLM2 has a template
        await pilot.press("ctrl+l")
        assert app.session.completion and "completion" in app.sub_title
        assert "continue" in app.prompt.placeholder
        app.prompt.value = TEXT
        await pilot.press("enter")
        await wait_run(pilot)
        first = app.conversation.replies[0]
        # the prompt is the document exactly: no template, no system prompt
        assert first.messages == (Message(DOCUMENT, TEXT),)
        assert first.start.prompt_text == TEXT
        assert "<|im_start|>" not in first.start.prompt_text
        # no control token, a BOS at most (SmolLM2 adds none)
        assert first.start.prompt_special in ((), (0,))
        assert "".join(first.start.prompt_token_texts[len(first.start.prompt_special) :]) == TEXT
        doc = the_document(app)
        assert doc.body_text() == TEXT + first.text
        assert "completion" in str(doc.info_text())

        # an empty Enter: more of the same document; the transcript still shows one document
        await pilot.press("enter")
        await wait_run(pilot)
        second = app.conversation.replies[1]
        assert second.start.prompt_text == TEXT + first.text
        # the user steers: the box's text is appended as typed
        app.prompt.value = " Then bake"
        await pilot.press("enter")
        await wait_run(pilot)
        third = app.conversation.replies[2]
        whole = TEXT + first.text + second.text + " Then bake"
        assert third.start.prompt_text == whole and third.start.prompt_special == second.start.prompt_special
        doc = the_document(app)
        assert doc.body_text() == whole + third.text
        shown = drawn(doc)
        assert "Document (completion mode) · reply 3" in shown.split("\n")[1]

        # the model's tokens are clickable, each reply's: the panel shows that pass
        metas = [seg.style.meta.get("token") for line in doc.lines for seg in line if seg.style and seg.style.meta]
        assert {m[0] for m in metas if m} == {1, 2, 3}
        step = next(s for s in first.steps if s.text and not s.is_stop)
        app.action_select_token(1, step.index)
        await pilot.pause()
        assert f"Forward pass {step.index + 1}" in panel_text(app)
        assert doc.selected_reply == 1 and doc.selected == step.index
        await pilot.press("escape")

        # Ctrl+T: the document the model read, with no template tokens
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        read = app.document.doc
        assert app.document.display and CONTROL not in {t.kind for t in read.tokens}
        text = "".join(s for row in read.rows for s, _, _ in row)
        assert text.replace("\n", "").startswith(whole.replace("\n", "↵"))  # the document, as it is
        assert "<|im_start|>" not in text and "<|im_end|>" not in text
        await pilot.press("ctrl+t")
        await document_settled(pilot)

        # F5: the last continuation again, in its place: still one document
        await pilot.press("f5")
        await wait_run(pilot)
        again = app.conversation.replies[3]
        assert again.start.prompt_text == whole and again.siblings == [third, again]
        doc = the_document(app)
        assert doc.record is again and doc.body_text() == whole + again.text
        assert "version 2/2" in drawn(doc)

        # blocking mode (F3): the document stays, its continuation appears whole at the end
        await pilot.press("f3")
        await pilot.press("enter")
        await wait_run(pilot)
        blocked = app.conversation.replies[-1]
        assert blocked.mode == "blocking" and blocked.start.prompt_text == whole + again.text
        assert the_document(app).body_text() == whole + again.text + blocked.text
        await pilot.press("f3")

        # Ctrl+N: a new document, still in completion mode
        await pilot.press("ctrl+n")
        assert app.transcript.blocks == [] and app.session.completion
        await pilot.press("enter")  # an empty document: one line saying what to do
        await pilot.pause()
        assert not app.conversation.replies
        # Ctrl+L again: chat mode
        await pilot.press("ctrl+l")
        assert not app.session.completion and "completion" not in app.sub_title


async def test_a_continuation_streams_onto_the_document_and_esc_stops_it(backend, tmp_path) -> None:
    from tui_fixtures import StepGate

    app = live_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await first_continuation(pilot)
        before = the_document(app).body_text()
        gate = StepGate(app, after=3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: gate.holding and app.steps_seen >= 3, 30, "the first steps")
        doc = the_document(app)
        live = "".join(s.text for s in app.current.steps if not s.is_stop)
        # streamed onto the document's open line, after the text already there
        await wait_for(pilot, lambda: doc.body_text() == before + live, 5, "the tokens in the body")
        # and on screen, at the next frame (the lines are laid out when drawn)
        await wait_for(pilot, lambda: live.strip()[:3] in drawn(doc).replace("\n│ ", ""), 5, "the tokens drawn")
        assert not app.current.done
        await pilot.press("escape")
        gate.release()
        await wait_run(pilot)
        cut = app.conversation.replies[-1]
        assert cut.finish.reason == "cancelled" and the_document(app).body_text() == before + cut.text
        await pilot.press("enter")  # the document goes on from the stopped continuation
        await wait_run(pilot)
        assert app.conversation.replies[-1].start.prompt_text == before + cut.text


async def test_the_mode_key_leaves_a_chat_for_a_new_document(backend, tmp_path) -> None:
    app = live_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await pilot.press(*"Hi", "enter")
        await wait_run(pilot)
        assert app.conversation.replies[0].messages[-1] == Message("user", "Hi")
        await pilot.press("ctrl+l")
        assert app.session.completion and app.conversation.replies == [] and app.transcript.blocks == []
        await pilot.press(*"Hi", "enter")
        await wait_run(pilot)
        assert app.conversation.replies[0].start.prompt_text == "Hi"  # the document, no chat


async def test_a_document_is_stored_and_reopens_as_a_document(backend, tmp_path) -> None:
    store = tmp_path / "history.sqlite3"
    app = live_app(backend, tmp_path, history=store)
    async with app.run_test(size=SIZE) as pilot:
        await first_continuation(pilot)
        app.prompt.value = " and"
        await pilot.press("enter")
        await wait_run(pilot)
        whole = the_document(app).body_text()
        assert app.history.writer.flush(10)
    with ConversationStore.open(store) as s:
        (summary,) = s.list_conversations()
        conv = s.load(summary.id)
    assert summary.title == TEXT and summary.replies == 2
    assert [(n.role, n.content) for n in conv.path() if n.role != "assistant"] == [(DOCUMENT, TEXT), (DOCUMENT, " and")]

    app = live_app(backend, tmp_path, history=store)  # a new start: in chat mode
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        assert not app.session.completion
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), 5, "the list")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, HistoryScreen), 5, "the list to close")
        assert app.session.completion and "completion" in app.sub_title
        assert the_document(app).body_text() == whole
        await pilot.press("enter")  # more of it: the whole stored document is the prompt
        await wait_run(pilot)
        assert app.conversation.replies[-1].start.prompt_text == whole
        assert the_document(app).body_text().startswith(whole)


async def test_a_model_without_a_chat_template_opens_in_completion_mode(gemma_path, tmp_path) -> None:
    from loopchat.backends.live import LiveBackend
    from loopchat.config import load_config

    config = tmp_path / "models.toml"
    config.write_text(f'[models.gemma-base]\npath = "{gemma_path}"\nn_ctx = 512\n', encoding="utf-8")
    b = LiveBackend(load_config(config), "gemma-base", threads=1)
    app = create_app(
        backend=b,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "prefs.json",
        settings=SamplingSettings(seed=1, max_tokens=6),
        history=False,
    )
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, app.model_ready.is_set, 60, "Gemma")
            assert app.session.completion and "completion" in app.sub_title
            # (a notice reaches the list when its message is handled: maybe a frame later)
            await wait_for(pilot, lambda: NO_TEMPLATE_NOTE in [n.message for n in app.notices], 5, "the notice")
            app.prompt.value = "The capital of France is"
            await pilot.press("enter")
            await wait_run(pilot)
            rec = app.conversation.replies[0]
            assert rec.start.prompt_text == "The capital of France is"
            assert "<|im_start|>" not in rec.start.prompt_text
            assert rec.start.prompt_special == (0,)  # Gemma's BOS, and no other control token
            assert rec.start.prompt_token_texts[0] == "<bos>"
    finally:
        b.close()


async def test_the_command_palette_switches_the_mode(tmp_path) -> None:
    app = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await palette_pick(pilot, "Completion mode")
        await wait_for(pilot, lambda: app.session.completion, 5, "completion mode")
        assert "completion" in app.sub_title
        assert "Completion mode → chat mode" in [c.title for c in app.key_commands()]


def test_mode_on_the_command_line(capsys) -> None:
    from tui_fixtures import FakeBackend

    from loopchat.cli.main import build_parser, main
    from loopchat.tui.app import LoopChatApp

    assert build_parser().parse_args(["--mode", "completion"]).mode == "completion"
    assert build_parser().parse_args([]).mode is None
    assert main(["--mode", "raw"]) == 2
    assert "--mode: invalid choice: 'raw'" in capsys.readouterr().err
    app = LoopChatApp(FakeBackend(), prefs=Prefs(), mode="completion")
    assert app.session.completion and app.session.mode_chosen  # a model that loads keeps it


async def test_a_branch_and_the_versions_of_a_continuation_stay_in_the_document(backend, tmp_path) -> None:
    from loopchat.tui.branch_picker import BranchPicker

    app = live_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await first_continuation(pilot)
        await pilot.press("enter")
        await wait_run(pilot)
        first, second = app.conversation.replies
        for _ in range(3):
            await pilot.press("alt+left")  # the token cursor, in the document's last continuation
        reply, at = app.selection
        assert reply == second.number and the_document(app).selected == at
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchPicker), 5, "the branch picker")
        await pilot.press("0")  # a new draw there
        await wait_run(pilot)
        branch = app.conversation.replies[-1]
        assert branch.start.prompt_text == second.start.prompt_text  # the same document
        assert branch.prefill.evaluated_tokens == 1  # the KV cache held the document and the prefix
        doc = the_document(app)
        assert doc.record is branch and doc.body_text() == TEXT + first.text + branch.text
        assert "version 2/2" in drawn(doc)
        await pilot.press("alt+pageup")  # the first version back in its place
        doc = the_document(app)
        assert doc.record is second and doc.body_text() == TEXT + first.text + second.text
        assert app.conversation.document() == TEXT + first.text + second.text


async def test_f9_replays_a_continuation_as_a_continuation(backend, tmp_path) -> None:
    """F9 on a continuation: the same text, in a block titled as a continuation (it said
    "Assistant"), the document left as it was."""
    app = live_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await first_continuation(pilot)
        first = app.conversation.replies[0]
        await pilot.press("f9")
        await wait_run(pilot)
        replay = app.conversation.replies[-1]
        assert replay.replay_of == first.number and replay.text == first.text
        title = next(line for line in drawn(app.transcript.reply_views()[-1]).splitlines() if line.strip())
        assert f"Continuation · reply {replay.number} · replay of reply {first.number}" in title, title
        assert "Assistant" not in title
        assert app.conversation.document() == TEXT + first.text


async def test_the_versions_of_an_earlier_continuation_take_the_later_ones_with_them(backend, tmp_path) -> None:
    app = live_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await first_continuation(pilot)
        await pilot.press("f5")  # a second version of the first continuation
        await wait_run(pilot)
        await pilot.press("enter")  # the document goes on from it
        await wait_run(pilot)
        one, again, later = app.conversation.replies
        assert the_document(app).body_text() == TEXT + again.text + later.text
        step = next(s for s in again.steps if s.text and not s.is_stop)
        app.action_select_token(again.number, step.index)
        await pilot.press("alt+pageup")  # the first version: the later continuation goes with the other
        assert the_document(app).body_text() == TEXT + one.text
        assert app.conversation.document() == TEXT + one.text
        step = next(s for s in one.steps if s.text and not s.is_stop)
        app.action_select_token(one.number, step.index)
        await pilot.press("alt+pagedown")  # back: with the continuation built on it
        doc = the_document(app)
        assert doc.body_text() == TEXT + again.text + later.text and doc.record is later
        assert app.conversation.document() == TEXT + again.text + later.text


async def test_a_document_too_long_for_the_context_leaves_the_document_as_it_was(backend, tmp_path) -> None:
    app = live_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await first_continuation(pilot)
        before = the_document(app).body_text()
        long = " flour" * 5000  # more tokens than the context holds
        app.prompt.value = long
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.last_error is not None, 30, "the refusal")
        await wait_run(pilot)
        assert "the document is too long for the context" in app.last_error
        assert the_document(app).body_text() == before and len(app.conversation.replies) == 1
        assert app.prompt.value == long  # the text is back in the box
