"""Keys that do what they say, and text that is never lost or reordered (issue 22, §3):
the token cursor never stops a reply, Ctrl+Q asks before a draft is lost, PgUp/PgDn
scroll the transcript from the message box, Esc during the prompt read gives the
message back without keeping it in the conversation, completion mode's space."""

from __future__ import annotations

import threading

import pytest
from tui_fixtures import FakeBackend, StepGate, document_settled, fake_app, reply_to, wait_for, wait_run

from loopchat.chat.prefs import Prefs
from loopchat.events import FinishReason, Start
from loopchat.history.store import ConversationStore
from loopchat.settings import SamplingSettings
from loopchat.tui.launch import create_app


@pytest.fixture(scope="module")
def live(live_backend):
    return live_backend  # the session's (conftest.py): loaded once for every chat module


class StartGate:
    """Holds the engine at the next reply's Start (inside the backend's emit), before it
    reads the prompt: a key pressed meanwhile lands during the prompt read, on any machine."""

    def __init__(self, app) -> None:
        self._open = threading.Event()
        self.held = threading.Event()
        sink = app.pump.emit

        def emit(event) -> None:
            sink(event)
            if isinstance(event, Start) and not self.held.is_set():
                self.held.set()
                self._open.wait(60)

        app.backend.attach(emit)

    def release(self) -> None:
        self._open.set()


async def test_alt_right_past_the_end_never_stops_the_reply(tmp_path) -> None:
    backend = FakeBackend(delay=0.001)
    app = fake_app(tmp_path, backend)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "Say hi.")
        backend.tokens = [f" t{i}" for i in range(40)]
        gate = StepGate(app, 5)  # the second reply is held mid-way: certainly still running
        await pilot.press(*"Go on", "enter")
        await wait_for(pilot, lambda: gate.holding, 10, "the second reply's steps")
        await pilot.press("alt+left")  # the last token of the finished reply
        first = app.conversation.replies[0]
        assert app.selection == (first.number, first.steps[-2].index)
        await pilot.press("alt+right")  # past its end: nothing selected, nothing stopped
        assert app.selection is None
        assert not app.backend._cancel.is_set()
        gate.release()
        await wait_run(pilot, 20)
        second = app.conversation.replies[1]
        assert second.finish.reason == FinishReason.STOP
        assert second.text == "".join(backend.tokens)


async def test_ctrl_q_with_a_draft_asks_once_then_quits(tmp_path) -> None:
    from test_tui_branch import notices
    from textual import events

    draft = "".join(f"line {i} of a long pasted text\n" for i in range(700))  # ~20 KB
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        app.post_message(events.Paste(draft))
        await wait_for(pilot, lambda: app.prompt.value == draft, 5, "the pasted draft")
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert app.is_running and app.prompt.value == draft  # not quit: asked
        assert f"The box holds {len(draft):,} characters: Ctrl+Q again quits" in notices(app)
        await pilot.press("x", "ctrl+q")  # the draft changed since: asked again
        await pilot.pause()
        assert app.is_running
        assert notices(app).count(f"The box holds {len(draft) + 1:,} characters: Ctrl+Q again quits") == 1
        await pilot.press("ctrl+q")  # twice: quits anyway
        await pilot.pause()
    assert app.return_value == 0
    assert not app.is_running


@pytest.mark.slow
async def test_page_keys_in_the_box_scroll_the_transcript(tmp_path) -> None:
    backend = FakeBackend(tokens=[f"line {i}\n" for i in range(120)], delay=0.0)
    app = fake_app(tmp_path, backend)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "Count.")
        t = app.transcript
        await wait_for(
            pilot, lambda: t.max_scroll_y > 2 * t.size.height and t.scroll_y == t.max_scroll_y, 10, "the end"
        )
        await pilot.press(*"one", "ctrl+j", *"two", "up", "end")  # a draft of two lines, the cursor on the first
        assert app.prompt.has_focus and app.prompt.cursor_location == (0, 3)
        bottom = t.scroll_y
        await pilot.press("pageup")
        await wait_for(pilot, lambda: t.scroll_y < bottom, 5, "PgUp's scroll")
        assert t.scroll_y == bottom - t.scrollable_content_region.height
        up = t.scroll_y
        await pilot.press("pageup", "pagedown")
        await wait_for(pilot, lambda: t.scroll_y == up, 5, "PgDn's scroll")
        await pilot.press("ctrl+home")
        await wait_for(pilot, lambda: t.scroll_y == 0, 5, "Ctrl+Home's scroll")
        await pilot.press("ctrl+end")
        await wait_for(pilot, lambda: t.scroll_y == t.max_scroll_y, 5, "Ctrl+End's scroll")
        # the box kept its text and its cursor; its own keys still move it
        assert app.prompt.value == "one\ntwo" and app.prompt.cursor_location == (0, 3)
        await pilot.press("down", "end", "!")
        assert app.prompt.value == "one\ntwo!"
        # the document view in the transcript's place: the same keys scroll it
        await pilot.press("ctrl+t", "?")  # (a character typed in the view goes to the box)
        body = app.document.body
        assert app.document.display and app.prompt.has_focus and app.prompt.value == "one\ntwo!?"
        await pilot.press("ctrl+end")
        await wait_for(pilot, lambda: body.max_scroll_y > 0 and body.scroll_y == body.max_scroll_y, 5, "the view's end")
        await pilot.press("pageup")
        await wait_for(pilot, lambda: body.scroll_y < body.max_scroll_y, 5, "the view's PgUp")


def stored_messages(path) -> list[tuple[str, str]]:
    """(role, content) of every node of every stored conversation, in order."""
    with ConversationStore.open_reader(path) as store:
        return [(n.role, n.content) for c in store.list_conversations()[::-1] for n in store.load(c.id).nodes]


async def stop_during_the_prompt_read(pilot, text: str, typed_since: str) -> None:
    """Send `text`, type `typed_since` while the engine is held before the prompt read,
    press Esc, let the engine go on: it reads the cancel before its first batch."""
    app = pilot.app
    gate = StartGate(app)
    await pilot.press(*text, "enter")
    await wait_for(pilot, gate.held.is_set, 30, "the reply's Start")
    await pilot.press(*typed_since, "escape")
    gate.release()
    await wait_run(pilot)


@pytest.mark.model
async def test_esc_during_the_prompt_read_gives_the_message_back_and_keeps_nothing(live, tmp_path) -> None:
    store = tmp_path / "h.sqlite3"
    app = create_app(
        backend=live,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "prefs.json",
        settings=SamplingSettings(seed=3, max_tokens=6),
        history=store,
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        # the first message: back in the box (before what was typed since), no turn, no
        # conversation in the store
        await stop_during_the_prompt_read(pilot, "Hello there.", "more")
        assert app.prompt.value == "Hello there.\nmore"
        assert app.transcript.blocks == [] and app.conversation.replies == [] and app.conversation.turns == []
        assert app.history.writer.flush(10)
        assert stored_messages(store) == []
        app.prompt.value = "Hello there."
        await pilot.press("enter")
        await wait_run(pilot)
        first = app.conversation.replies[0]
        assert first.number == 1 and first.text and len(app.transcript.blocks) == 2
        # a later message: the turn goes, the conversation before it stays
        await stop_during_the_prompt_read(pilot, "Second.", "")
        assert app.prompt.value == "Second."
        assert len(app.transcript.blocks) == 2 and app.conversation.replies == [first]
        assert app.history.writer.flush(10)
        assert stored_messages(store) == [("user", "Hello there."), ("assistant", first.text)]
        # sent again: stored once, the KV cache's prefix (the first exchange) reused
        await pilot.press("enter")
        await wait_run(pilot)
        second = app.conversation.replies[1]
        assert second.number == 2 and second.finish.reason != FinishReason.CANCELLED and second.text
        assert second.prefill.reused_tokens > 0
        assert [m.content for m in app.conversation.turns] == ["Hello there.", first.text, "Second.", second.text]
        assert app.history.writer.flush(10)
        assert stored_messages(store) == [
            ("user", "Hello there."),
            ("assistant", first.text),
            ("user", "Second."),
            ("assistant", second.text),
        ]


async def test_control_characters_are_drawn_as_symbols_and_sent_as_they_are(tmp_path) -> None:
    from textual import events

    pasted = "A1 [\x1b[31mred] B2\x07\x7f"
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        app.post_message(events.Paste(pasted))
        await wait_for(pilot, lambda: app.prompt.value == pasted, 5, "the paste")
        await pilot.pause()
        box = app.prompt.render_line(0).text
        assert box.startswith("A1 [␛[31mred] B2") and "\x1b" not in box  # (rich drops the BEL itself)
        await pilot.press("enter")
        await wait_run(pilot)
        assert app.conversation.replies[0].messages[-1].content == pasted  # the model reads the real characters
        you = app.transcript.blocks[0]
        assert "│ A1 [␛[31mred] B2␇␡" in [you.line(i).text.rstrip() for i in range(you.height)]


@pytest.mark.model
async def test_completion_mode_adds_the_space_a_typed_word_needs_and_a_pref_turns_it_off(live, tmp_path) -> None:
    from test_tui_branch import notices
    from tui_fixtures import palette_pick

    from loopchat.chat.prefs import load_prefs

    app = create_app(
        backend=live,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "prefs.json",
        settings=SamplingSettings(seed=1, max_tokens=6, temperature=0.0),
        history=False,
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await pilot.press("ctrl+l")
        assert "appended as typed (a space first if it would glue to a word)" in app.prompt.placeholder
        await pilot.press(*"Once upon a time", "enter")  # an empty document: nothing before it
        await wait_run(pilot)
        doc = app.conversation.document()
        assert doc.startswith("Once upon a time") and not doc[-1].isspace(), doc  # (greedy: the same every run)
        await pilot.press(*"she", "enter")
        await wait_run(pilot)
        second = app.conversation.replies[1]
        assert second.messages[0].content == doc + " she"  # what the model read
        assert app.transcript.blocks[0].body_text().startswith(doc + " she")
        await pilot.press("ctrl+t")  # the document view: the exact text the model read, the space in it
        await document_settled(pilot)
        await wait_for(pilot, lambda: app.document.display and app.document.doc.tokens, 10, "the document view")
        read = "".join(t.text for t in app.document.doc.tokens)
        assert read.startswith(doc + " she"), read
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        # the pref off (palette): appended exactly as typed, and remembered
        await palette_pick(pilot, "space before typed text")
        assert load_prefs(tmp_path / "prefs.json").completion_space is False
        assert "Completion mode: your text is appended exactly as typed" in notices(app)
        assert "appended exactly as typed" in app.prompt.placeholder
        doc = app.conversation.document()
        assert not doc[-1].isspace(), doc
        await pilot.press(*"and", "enter")
        await wait_run(pilot)
        assert app.conversation.replies[2].messages[0].content == doc + "and"


@pytest.mark.model
async def test_the_document_view_draws_a_pasted_escape_as_a_symbol(live, tmp_path) -> None:
    from textual import events

    app = create_app(
        backend=live,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "prefs.json",
        settings=SamplingSettings(seed=1, max_tokens=4),
        history=False,
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        app.post_message(events.Paste("Say \x1b[31mred\r"))
        await wait_for(pilot, lambda: app.prompt.value, 5, "the paste")
        await pilot.press("enter")
        await wait_run(pilot)
        assert "\x1b[31mred" in app.conversation.replies[0].start.prompt_text  # the model read the ESC
        await pilot.press("ctrl+t")
        await document_settled(pilot)

        def shown() -> str:
            return "".join(text for row in app.document.doc.rows for text, _, _ in row)

        # the model starts as one empty row ([[]], truthy), filled as the view reads the document
        await wait_for(pilot, lambda: app.document.display and "Say" in shown(), 10, "the document view's text")
        assert "Say ␛[31mred" in shown() and "\x1b" not in shown()


def test_the_paste_parser_keeps_keys_as_textuals_and_a_paste_whole_however_it_is_cut() -> None:
    """Keys around the paste parse as Textual's own parser parses them; the paste, its
    markers cut anywhere between reads, is one Paste event with every character in order."""
    import time

    from textual import events
    from textual._xterm_parser import XTermParser

    from loopchat.tui.render.paste import PasteParser

    def parse(parser, pieces, keys: bool = False) -> list:
        out = []
        for piece in pieces:
            out += list(parser.feed(piece))
            if keys:  # each piece a read of its own, past Textual's escape delay (a lone ESC: Esc)
                time.sleep(0.15)
                out += list(parser.tick())
        return [e.text if isinstance(e, events.Paste) else getattr(e, "key", None) for e in out]

    keys = ["a\x1b[A", "\x1b[20~", "\x1bx", "\x1b[1;5F", "\x1b", "\x1b[I"]  # a, Up, F9, Alt+x, Ctrl+End, Esc, focus
    assert (
        parse(PasteParser(), keys, True)
        == parse(XTermParser(), keys, True)
        == ["a", "up", "f9", "alt+x", "ctrl+end", "escape", None]
    )
    pasted = "A1 [\x1b[31mred] B2\x1b[0m\nnext\x1b"
    data = "x\x1b[200~" + pasted + "\x1b[201~y"
    for cut in range(1, len(data)):  # (an empty read is the end of the input)
        assert parse(PasteParser(), [data[:cut], data[cut:]]) == ["x", pasted, "y"], cut


async def test_scrolled_up_the_transcript_stops_following_the_reply_until_back_at_the_end(tmp_path) -> None:
    backend = FakeBackend(tokens=[f"line {i}\n" for i in range(150)], delay=0.0)
    app = fake_app(tmp_path, backend)
    async with app.run_test(size=(120, 40)) as pilot:
        t = app.transcript
        gate = StepGate(app, 60)  # the reply held with a screenful of lines written
        await pilot.press(*"Count.", "enter")
        await wait_for(pilot, lambda: gate.holding and t.max_scroll_y > 0, 10, "the reply's first lines")
        await wait_for(pilot, lambda: t.scroll_y == t.max_scroll_y, 5, "the view following the reply")
        await pilot.press("pageup")
        await wait_for(pilot, lambda: t.scroll_y < t.max_scroll_y, 5, "PgUp's scroll")
        up, grown_from = t.scroll_y, t.max_scroll_y
        gate.release()
        await wait_run(pilot, 20)
        await pilot.pause()
        assert t.max_scroll_y > grown_from and t.scroll_y == up  # it grew; the view stayed where it was put
        await pilot.press("ctrl+end")
        await wait_for(pilot, lambda: t.scroll_y == t.max_scroll_y, 5, "Ctrl+End")
        await pilot.press(*"Again.", "enter")  # back at the end: it follows the next reply
        await wait_run(pilot, 20)
        await wait_for(pilot, lambda: t.scroll_y == t.max_scroll_y, 5, "the view following the reply")
