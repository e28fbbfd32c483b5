"""The document view (Ctrl+T): the transcript's place shows the exact text the model
reads, token by token, with the template's control tokens set apart, where the reply
begins, each token's id under a cursor, the prefill's KV-cache figures and what the
context policy dropped. Replayed traces (tests/data/document.jsonl, recorded with the
per-token texts; tests/data/reply.jsonl, an older trace without them) and the real
default model for a live reply."""

from __future__ import annotations

import pytest
from tui_fixtures import DATA, REPLY_TRACE, StepGate, document_settled, palette_pick, panel_text, wait_for, wait_run

from loopchat.chat.conversation import STREAM, ReplyRecord
from loopchat.chat.prefs import Prefs
from loopchat.events import ContextTrimmed, Finish, Prefill, Step
from loopchat.settings import SamplingSettings
from loopchat.trace import read_trace
from loopchat.tui.document_view import (
    _FG,
    CONTROL,
    PROMPT,
    REPLY,
    REPLY_MARK,
    DocToken,
    DocumentBody,
    DocumentLines,
    header_lines,
    shown_form,
)
from loopchat.tui.launch import create_app

DOC_TRACE = DATA / "document.jsonl"
SIZE = (120, 40)


def replay_app(tmp_path, trace=DOC_TRACE, **prefs):
    prefs.setdefault("markdown", False)
    return create_app(replay=str(trace), replay_speed=0, prefs=Prefs(**prefs), prefs_path=tmp_path / "p.json")


def plain(lines) -> str:
    return "\n".join("".join(s for s, _ in line) for line in lines)


def status(app) -> str:
    return plain(app.document.status.lines)


def head(app) -> str:
    return plain(app.document.head.lines)


def trace_record(path=DOC_TRACE) -> ReplyRecord:
    _, traced = read_trace(path)
    events = [t.event for t in traced]
    rec = ReplyRecord(1, STREAM, events[0].messages, start=events[0])
    for ev in events[1:]:
        if isinstance(ev, Prefill):
            rec.prefill = ev
        elif isinstance(ev, Step):
            rec.steps.append(ev)
        elif isinstance(ev, Finish):
            rec.finish = ev
    return rec


async def shown(pilot) -> None:
    """The played trace has ended and Ctrl+T shows its document."""
    await wait_run(pilot, 10)
    await pilot.press("ctrl+t")
    await document_settled(pilot)


# ------------------------------------------------------------ a recorded trace ----
async def test_ctrl_t_shows_the_exact_text_and_back(tmp_path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await shown(pilot)
        doc = app.document
        assert doc.display and not app.transcript.display
        assert isinstance(app.focused, DocumentBody)  # the cursor keys go to the document
        start = app.conversation.replies[0].start
        rec = app.conversation.replies[0]
        texts = start.prompt_token_texts
        assert len(texts) == len(start.prompt_token_ids) == 35
        assert "".join(texts) == start.prompt_text  # joined: the exact text
        reply = "".join(s.text if not s.is_stop else s.piece for s in rec.steps)
        assert doc.doc.shown_text() == shown_form("".join(texts) + reply)
        # the rows on screen are the document's rows: the first is the template's start
        rows = [strip.text for strip in doc.body.render_lines(doc.body.size.region)]
        assert rows[0].strip() == "<|im_start|>system↵"
        # where the reply begins: a marker row, the cursor on the reply's first token
        marker = next(iter(doc.doc.markers))
        assert doc.doc.rows[marker][0][0] == REPLY_MARK
        assert doc.doc.tokens[doc.reply_start].first_row == marker + 1
        assert status(app) == f"id {rec.steps[0].token_id} · {rec.steps[0].piece!r} · position 35 · reply step 0"
        # the header: the prompt, the prefill's reuse, the context policy
        h = head(app)
        assert "Reply 1" in h and "prompt 35 tokens (5 control)" in h
        assert f"KV cache: {rec.prefill.reused_tokens} reused, {rec.prefill.evaluated_tokens} evaluated" in h
        assert "context policy: nothing dropped" in h and "older trace" not in h
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        assert app.transcript.display and not doc.display
        assert app.prompt.disabled and app.focused is app.transcript  # a replay has no message box


async def test_control_tokens_are_set_apart(tmp_path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await shown(pilot)
        doc = app.document.doc
        start = app.conversation.replies[0].start
        assert start.prompt_special == (0, 19, 21, 29, 31)
        for i, t in enumerate(doc.tokens[: len(start.prompt_token_ids)]):
            assert t.kind == (CONTROL if i in start.prompt_special else PROMPT)
            styles = {style for row in doc.rows[t.first_row : t.last_row + 1] for s, style, k in row if k == i}
            fg = {s.color for s in styles}
            assert fg == {_FG[t.kind].color}, (i, t)
            assert all(s.bold for s in styles) == (t.kind == CONTROL)
        # token boundaries: neighbours on alternating backgrounds
        bgs = [
            doc.rows[t.first_row][[k for _, _, k in doc.rows[t.first_row]].index(i)][1].bgcolor
            for i, t in enumerate(doc.tokens[:6])
        ]
        assert bgs[0] != bgs[1] and bgs[0] == bgs[2] and bgs[1] == bgs[3]


@pytest.mark.slow
async def test_the_cursor_names_each_prompt_token_id(tmp_path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await shown(pilot)
        start = app.conversation.replies[0].start
        await pilot.press("home")
        for pos, (tid, text) in enumerate(zip(start.prompt_token_ids, start.prompt_token_texts)):
            assert status(app).startswith(f"id {tid} · {text!r} · position {pos} · "), status(app)
            await pilot.press("right")
        assert app.document.cursor_token.kind == REPLY  # right after the prompt: the reply


async def test_cursor_keys(tmp_path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await shown(pilot)
        body = app.document.body
        doc = app.document.doc
        n = len(doc.tokens)
        first = app.document.reply_start
        assert body.cursor == first
        await pilot.press("left")
        assert body.cursor == first - 1  # the prompt's last token ("\n" after assistant)
        await pilot.press("right", "right")
        assert body.cursor == first + 1
        await pilot.press("end")
        assert body.cursor == n - 1
        # the cursor on a reply token: the loop panel shows its step (a selected token)
        last = doc.tokens[n - 1].step
        await pilot.pause()
        assert app.selection == (1, last.index)
        assert f"Forward pass {last.index + 1}" in panel_text(app)
        await pilot.press("home")
        assert body.cursor == 0 and doc.tokens[0].first_row == 0
        await pilot.press("down")
        assert doc.tokens[body.cursor].first_row == 1  # "You", on the row under <|im_start|>system
        await pilot.press("up")
        assert doc.tokens[body.cursor].first_row == 0
        await pilot.press("pagedown")
        assert doc.tokens[body.cursor].first_row > 1  # a page down (the document is shorter: its end)
        await pilot.press("pageup")
        assert doc.tokens[body.cursor].first_row == 0
        await pilot.press("left")  # at the first token: stays
        assert body.cursor == 0
        app.clear_notifications()
        await pilot.press("enter", "n", "3", "slash")  # the die's keys: nothing to draw, no notice
        await pilot.pause()
        assert not app.notices and body.cursor == 0 and app.document.display
        await pilot.press("end")  # a reply token: selected (the panel shows its step)
        await pilot.pause()
        assert app.selection is not None
        await pilot.press("escape")  # clears the selection, the view stays
        await pilot.pause()
        assert app.selection is None and app.document.display
        await pilot.press("escape")  # then back to the chat
        await pilot.pause()
        assert not app.document.display and app.transcript.display


async def test_up_and_pageup_on_the_first_row_do_not_move_the_cursor_down(tmp_path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await shown(pilot)
        body = app.document.body
        doc = app.document.doc
        await pilot.press("home", "up")
        assert body.cursor == 0
        await pilot.press("pageup")
        assert body.cursor == 0
        await pilot.press("right", "up")  # a later token of the first row: to the first token
        assert body.cursor == 0
        await pilot.press("end", "down", "pagedown")  # and on the last row: stays at the end
        assert body.cursor == len(doc.tokens) - 1


async def test_a_short_view_keeps_its_rows_for_the_text(tmp_path) -> None:
    """80x24: the panel under the view leaves it 9 rows; the header took 6 of them (the
    text had 1 row). The short header: the title and the figures together, no legend and
    no "nothing dropped"; back to the full header on a taller screen."""
    app = replay_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await shown(pilot)
        doc = app.document
        # the view's first size comes in the layout after Ctrl+T showed it; the short header
        # (and the body's new height) in the one after: await them (the full header came first)
        await wait_for(
            pilot,
            lambda: len(doc.head.lines) <= 2 and doc.body.size.height >= 5,
            timeout=15,
            what="the short header at 80x24, the body its rows",
        )
        assert len(doc.head.lines) <= 2 and doc.body.size.height >= 5, (len(doc.head.lines), doc.body.size)
        text = head(app)
        assert "Reply 1 as the model reads it" in text and "KV cache: 0 reused, 35 evaluated" in text
        assert "nothing dropped" not in text and "cursor:" not in text
        await pilot.resize_terminal(120, 40)
        # the header's new lines and its new height come in two layout passes (a loaded
        # machine showed the lines before the height), and the view passes through narrower
        # widths on its way (lines made for them wrap "nothing dropped"): await the last
        await wait_for(
            pilot,
            lambda: (
                "cursor:" in head(app)
                and "nothing dropped" in head(app)
                and doc.head.size.height == len(doc.head.lines)
            ),
            timeout=15,
            what="the full header at 120x40, its height its number of lines",
        )
        assert "nothing dropped" in head(app) and "cursor:" in head(app)
        assert doc.head.size.height == len(doc.head.lines)


async def test_an_older_trace_falls_back_to_the_prompt_text(tmp_path) -> None:
    app = replay_app(tmp_path, trace=REPLY_TRACE)
    async with app.run_test(size=SIZE) as pilot:
        await shown(pilot)
        start = app.conversation.replies[0].start
        assert not start.prompt_token_texts
        doc = app.document
        assert doc.fallback
        assert "an older trace: no per-token texts recorded" in head(app)
        assert doc.doc.shown_text().startswith(shown_form(start.prompt_text))
        await pilot.press("home")
        assert status(app).startswith("the prompt as its text · no token boundaries or ids")
        await pilot.press("right")
        st = app.conversation.replies[0].steps[0]
        assert status(app).startswith(f"id {st.token_id} · {st.piece!r} · position {len(start.prompt_token_ids)}")


async def test_the_selected_token_is_the_cursor(tmp_path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_run(pilot, 10)
        await pilot.press("alt+left", "alt+left")  # the reply's last tokens
        await pilot.pause()
        step = app.selection[1]
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        assert app.document.cursor_token.step.index == step
        await pilot.press("escape")  # the selection goes: the latest reply, its start
        await pilot.pause()
        assert app.document.display


@pytest.mark.slow
async def test_ctrl_t_before_any_reply_then_a_reply_a_new_conversation_and_a_narrow_screen(tmp_path) -> None:
    from tui_fixtures import FakeBackend

    from loopchat.tui.app import LoopChatApp

    app = LoopChatApp(FakeBackend(delay=0.002), prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        assert app.document.display and "no reply yet" in head(app) and status(app) == "no token"
        head_w = app.document.head.content_size.width  # laid out at its width (it took 80: cut here)
        assert all(sum(len(t) for t, _ in line) <= head_w for line in app.document.head.lines)
        for key in ("left", "right", "up", "down", "pageup", "pagedown", "home", "end"):
            await pilot.press(key)  # nothing to move over: no harm
        await pilot.press("ctrl+t")  # back to the box, to type
        await document_settled(pilot)
        await pilot.press(*"hi", "enter", "ctrl+t")
        await wait_run(pilot)
        await pilot.pause()
        rec = app.conversation.replies[0]
        assert app.document.record is rec and "Reply 1" in head(app)
        # the header grew from one line to several: all of them shown (it kept the height of one)
        assert app.document.head.size.height == len(app.document.head.lines) > 2
        # the fake's Start has a prompt text and no per-token texts: the fallback
        assert app.document.fallback and app.document.doc.shown_text().startswith("prompt")
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.document.record is None and "no reply yet" in head(app)
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.document.display
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        assert app.transcript.display and app.focused is app.prompt


@pytest.mark.slow
async def test_the_command_palette_shows_the_document(tmp_path) -> None:
    app = replay_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_run(pilot, 10)
        await palette_pick(pilot, "Document view")
        await wait_for(pilot, lambda: app.document.display, 5, "the document")
        assert not app.transcript.display and "Reply 1" in head(app)


def test_a_server_that_sends_no_prompt() -> None:
    import dataclasses

    rec = trace_record()
    rec.start = dataclasses.replace(
        rec.start, prompt_text=None, prompt_token_ids=None, prompt_token_texts=(), prompt_special=()
    )
    text = plain(header_lines(rec, False, 200))
    assert "prompt: not given by the server" in text and "only the reply's tokens are shown" in text


def test_the_header_breaks_between_its_figures_never_inside_one() -> None:
    """At 120 columns with the wire view beside it (58 columns), the header read
    "… Ctrl+T: back to the" / "chat" and "KV cache: 372 reused, 15" / "evaluated"."""
    import dataclasses

    rec = trace_record()
    rec.prefill = dataclasses.replace(rec.prefill, prompt_tokens=387, reused_tokens=372, evaluated_tokens=15)
    rows = [r.rstrip() for r in plain(header_lines(rec, False, 58)).splitlines()]
    assert all(len(r) <= 58 for r in rows), rows
    assert f"Reply {rec.number} · the text the model reads" in rows and "Ctrl+T: back to the chat" in rows, rows
    figures = [
        f"KV cache: {rec.prefill.reused_tokens:,} reused, {rec.prefill.evaluated_tokens:,} evaluated",
        f"reply {sum(1 for s in rec.steps if not s.is_stop):,} tokens",
        "cursor: ←/→ ↑/↓ PgUp/PgDn Home/End",
    ]
    for figure in figures:
        assert any(figure in r for r in rows), (figure, rows)
    assert not any(r.startswith("·") or r.endswith("·") for r in rows), rows
    assert plain(header_lines(rec, False, 200)).splitlines()[0].endswith("Ctrl+T: back to the chat")  # wide: one row


def test_the_header_says_what_the_context_policy_dropped() -> None:
    rec = trace_record()
    rec.trimmed = ContextTrimmed("drop oldest turns", 4, 5012, 3890, 4096)
    text = plain(header_lines(rec, False, 200))
    assert "context policy (drop oldest turns): 4 message(s) dropped, 5,012 → 3,890 tokens (n_ctx 4,096)" in text
    assert "nothing dropped" not in text


def test_rows_wrap_and_keep_every_character() -> None:
    doc = DocumentLines(7)
    for i, t in enumerate(["<|im_start|>", "user", "\n", "héllo", " wörld", "\t", "日本語", "\n"]):
        doc.add(DocToken(t, i, PROMPT, i))
    assert all(sum(len(s) for s, _, _ in row) <= 7 for row in doc.rows)
    assert doc.shown_text() == shown_form("<|im_start|>user\nhéllo wörld\t日本語\n")
    assert doc.tokens[0].first_row == 0 and doc.tokens[0].last_row == 1  # 12 cells in rows of 7


def test_rows_break_between_tokens() -> None:
    """A token that fits a row is not cut at the row's end ('Hugging F' / 'ace' read as two
    tokens); one longer than a row is."""
    doc = DocumentLines(10)
    for i, t in enumerate(["Hugging", " Face", " is", " a", " company", " supercalifragilistic"]):
        doc.add(DocToken(t, i, PROMPT, i))
    rows = ["".join(s for s, _, _ in row) for row in doc.rows]
    assert rows == ["Hugging", " Face is a", " company s", "upercalifr", "agilistic"]
    assert doc.shown_text() == "Hugging Face is a company supercalifragilistic"
    assert [(t.first_row, t.last_row) for t in doc.tokens] == [(0, 0), (1, 1), (1, 1), (1, 1), (2, 2), (2, 4)]


def test_a_4000_token_context_is_laid_out_at_once_and_drawn_a_screen_at_a_time() -> None:
    """Laid out token by token, each row where its newline put it. (How long it takes, and a
    screen's drawing: benchmarks/document_scroll.py; a timed assertion here failed under the
    suite's load at 556 ms against 500.)"""
    rec = trace_record()
    words = [" the", " loop", " reads", " one", " text", ".\n"] * 700
    doc = DocumentLines(100)
    for i, w in enumerate(words[:4000]):
        doc.add(DocToken(w, i, PROMPT, i))
    for st in rec.steps:
        doc.add(DocToken(st.text, st.token_id, REPLY, 4000 + st.index, st))
    assert len(doc.tokens) == 4000 + len(rec.steps)
    assert [t.first_row for t in doc.tokens[:4000]] == [i // 6 for i in range(4000)]  # a row a sentence
    assert {(t.first_row, t.last_row) for t in doc.tokens[4000:]} == {(666, 666)}  # the reply goes on row 666
    assert doc.height == 667


# ------------------------------------------------------------------- the snapshot ----
def test_document_view_snapshot(snap_compare, tmp_path) -> None:
    async def run_before(pilot) -> None:
        await shown(pilot)
        await pilot.press("right", "right")
        await pilot.pause()

    assert snap_compare(replay_app(tmp_path), terminal_size=SIZE, run_before=run_before)


# ---------------------------------------------------------------------- live ----
@pytest.fixture(scope="module")
def backend(live_backend):
    return live_backend  # the session's (conftest.py): loaded once for every chat module


def live_app(backend, tmp_path, max_tokens: int):
    """The chat on the default model (seed 3, temperature 0.8), no history."""
    return create_app(
        backend=backend,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "p.json",
        settings=SamplingSettings(seed=3, max_tokens=max_tokens, temperature=0.8),
        history=False,
    )


@pytest.mark.model
async def test_a_live_reply_grows_in_the_document_and_ids_match_tokenize(backend, tmp_path) -> None:
    app = live_app(backend, tmp_path, max_tokens=24)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        gate = StepGate(app, after=4)
        await pilot.press(*"Write a short poem about the sea.", "enter")
        await wait_for(pilot, lambda: gate.holding and app.steps_seen >= 4, 30, "the first steps")
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        doc = app.document
        rec = app.current
        assert doc.record is rec and not rec.done
        assert "so far" in head(app)
        n_prompt = len(rec.start.prompt_token_ids)
        engine = backend.worker._engine
        assert engine.tokenize(rec.start.prompt_text) == list(rec.start.prompt_token_ids)
        assert [t.token_id for t in doc.doc.tokens[:n_prompt]] == list(rec.start.prompt_token_ids)
        before = len(doc.doc.tokens)
        gate.release()
        await wait_run(pilot)
        await pilot.pause()
        assert len(doc.doc.tokens) == n_prompt + len(rec.steps) > before  # the reply's steps, appended
        assert [t.token_id for t in doc.doc.tokens[n_prompt:]] == [s.token_id for s in rec.steps]
        await pilot.press("home")
        for tid in rec.start.prompt_token_ids[:5]:
            assert status(app).startswith(f"id {tid} · "), status(app)
            await pilot.press("right")
        # a second turn: the document is the new reply's, its prefill reused the cache
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        await pilot.press(*"Thanks", "enter")
        await wait_run(pilot)
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        second = app.conversation.replies[1]
        assert doc.record is second and second.prefill.reused_tokens > 0
        assert f"KV cache: {second.prefill.reused_tokens} reused" in head(app)
        assert doc.doc.shown_text().startswith(shown_form(second.start.prompt_text))


@pytest.mark.model
async def test_ctrl_t_while_the_loop_is_stopped_gives_the_die_bar_its_focus_back(backend, tmp_path) -> None:
    from loopchat.tui.step_mode import StepBar

    app = live_app(backend, tmp_path, max_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await pilot.press("f12")  # armed: the next reply stops before its first draw
        await pilot.press(*"Hello there", "enter")
        await wait_for(pilot, lambda: app.session.stopped and isinstance(app.focused, StepBar), 30, "the stop")
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        doc = app.document
        assert isinstance(app.focused, DocumentBody) and doc.record is app.current
        n_prompt = len(app.current.start.prompt_token_ids)
        assert len(doc.doc.tokens) == n_prompt  # stopped before the first draw: the prompt only
        assert "step mode: stopped before token 1, drawn at the end of this text" in head(app)
        await pilot.press("home", "right")
        assert status(app).startswith(f"id {app.current.start.prompt_token_ids[1]} · ")
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        assert isinstance(app.focused, StepBar)  # the die's keys work again
        await pilot.press("enter")  # one draw
        await wait_for(pilot, lambda: len(app.current.steps) == 1, 30, "the drawn token")
        await pilot.press("escape")
        await wait_run(pilot)


@pytest.mark.model
async def test_the_die_keys_work_in_the_document_view_and_a_stop_leaves_it_the_focus(backend, tmp_path) -> None:
    from loopchat.tui.step_mode import StepBar

    app = live_app(backend, tmp_path, max_tokens=40)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        gate = StepGate(app, after=3)
        await pilot.press(*"Write a short poem about the sea.", "enter")
        await wait_for(pilot, lambda: gate.holding, 30, "the first steps")
        await pilot.press("ctrl+t")  # the document of the live reply
        await document_settled(pilot)
        await pilot.press("f12")  # stops before its next draw
        gate.release()
        s = app.session
        await wait_for(pilot, lambda: s.stopped or not app.generating, 30, "the stop")
        assert s.stopped, "the reply ended before it could stop"
        await pilot.pause()
        assert isinstance(app.focused, DocumentBody)  # the stop left the document its keys
        rec = app.current
        n_prompt = len(rec.start.prompt_token_ids)
        n = len(rec.steps)
        await pilot.press("enter")  # the die bar's Enter, from the document view: one draw
        await wait_for(pilot, lambda: len(rec.steps) == n + 1 and s.stopped, 30, "one draw")
        assert rec.steps[-1].chosen_by == "step"
        want = s.pending.raw_top[1]
        await pilot.press("2")  # a pick by rank
        await wait_for(pilot, lambda: len(rec.steps) == n + 2 and s.stopped, 30, "the pick")
        assert (rec.steps[-1].token_id, rec.steps[-1].chosen_by) == (want.token_id, "hand")
        await pilot.pause()
        assert len(app.document.doc.tokens) == n_prompt + n + 2  # both drawn into the document
        await pilot.press("end")
        assert status(app).startswith(f"id {want.token_id} · ") and status(app).endswith(" · picked by hand")
        await pilot.press("left")
        assert "picked by hand" not in status(app)  # the token drawn with Enter
        assert f"stopped before token {n + 3}," in head(app)
        await pilot.press("ctrl+t")  # back: the die bar has the focus (the loop is stopped)
        await document_settled(pilot)
        assert isinstance(app.focused, StepBar)
        await pilot.press("escape")
        await wait_run(pilot)


@pytest.mark.model
async def test_a_live_reply_in_a_short_view_stays_in_sight(backend, tmp_path) -> None:
    """80x24: the view has a few rows; the reply's newest tokens stay in them as it grows
    (the view stayed where it was opened and the reply went on below it)."""
    app = live_app(backend, tmp_path, max_tokens=60)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        gate = StepGate(app, after=2)
        await pilot.press("f12")  # armed: stopped before its first draw, then 10 tokens, stopped again
        await pilot.press(*"Write a short poem about the sea.", "enter")
        await wait_for(pilot, lambda: app.session.stopped, 30, "the stop")
        await pilot.press("n")
        await wait_for(pilot, lambda: gate.holding, 30, "the first steps")
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        body = app.document.body
        view_h = body.scrollable_content_region.height
        top = body.scroll_offset.y
        assert top <= app.document.doc.tokens[app.document.reply_start].first_row < top + view_h  # its start
        gate.release()
        await wait_for(pilot, lambda: app.session.stopped and app.session.pending.index == 10, 30, "10 draws")
        await pilot.pause()
        await pilot.pause()

        def in_sight() -> tuple:
            doc = app.document.doc
            view_h = body.scrollable_content_region.height
            last = doc.tokens[-1].last_row
            return body.scroll_offset.y <= last < body.scroll_offset.y + view_h, (body.scroll_offset.y, last, view_h)

        # stopped: the header got its step-mode line, the view a row less; the end stays in it
        assert "stopped before token 11" in head(app)
        assert in_sight()[0], in_sight()
        await pilot.press("f12")  # runs freely to its end
        await wait_run(pilot)
        await pilot.pause()
        assert app.document.doc.height > body.scrollable_content_region.height + 2, "the reply did not outgrow the view"
        assert in_sight()[0], in_sight()
