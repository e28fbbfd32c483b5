"""Fast TUI checks with no model: plots, prefs, the panel text, error handling."""

from __future__ import annotations

import json

import pytest
from gc_check import cyclic_garbage
from tui_fixtures import FakeBackend, document_settled, fake_app, panel_text, reply_to, wait_for, wait_run

from loopchat.chat.plots import bar, fmt_ms, fmt_ms_range, fmt_prob, fmt_rate, fmt_tokens, show_token, sparkline
from loopchat.chat.prefs import Prefs, load_prefs, save_prefs
from loopchat.tui.app import LoopChatApp


def test_plots() -> None:
    assert bar(1.0, 4) == "████"
    assert bar(0.0, 4) == "    "
    assert len(bar(0.33, 7)) == 7
    assert len(sparkline(list(range(100)), 20)) == 20
    assert sparkline([1.0, 8.0], 2)[0] == "▁" and sparkline([1.0, 8.0], 2)[1] == "█"
    assert fmt_ms(12.34) == "12.3 ms" and fmt_ms(1500) == "1.50 s"
    assert fmt_prob(0.5) == "50.0%" and fmt_prob(0.0001) == "<0.1%"
    assert show_token(" a\n") == "␣a⏎"
    # one unit for both ends of a range (not "12.1–3.57 s")
    assert fmt_ms_range(12.1, 3570) == "0.01–3.57 s" and fmt_ms_range(8.0, 35.7) == "8.0–35.7 ms"
    assert fmt_ms_range(95.0, 250.0) == "95–250 ms" and fmt_ms_range(900.0, 12_500) == "0.9–12.5 s"
    assert fmt_rate(0.34) == "0.3 tok/s" and fmt_rate(85.4) == "85 tok/s"
    assert fmt_tokens(1) == "1 token" and fmt_tokens(0) == "0 tokens" and fmt_tokens(1200) == "1,200 tokens"


async def test_a_reply_of_one_token_says_1_token(tmp_path) -> None:
    """A reply of one token (a JSON constraint's `{}`, say) said "1 tokens" under it."""
    from tui_fixtures import FakeBackend

    app = fake_app(tmp_path, FakeBackend(tokens=["{}"], delay=0.0))
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "A cat as JSON")
        info = str(app.transcript.reply_views()[0].info_text())
        assert " · 1 token · " in info and "tokens" not in info, info


def test_prefs_round_trip(tmp_path) -> None:
    path = tmp_path / "p.json"
    assert load_prefs(path) == Prefs()
    prefs = Prefs(token_boundaries=True, streaming=False)
    assert save_prefs(prefs, path) is None
    assert load_prefs(path) == prefs
    path.write_text("{not json")
    assert load_prefs(path) == Prefs()
    path.write_text(json.dumps({"markdown": False, "bogus": 1, "streaming": "yes"}))
    assert load_prefs(path) == Prefs(markdown=False)


async def test_fake_reply_streams_and_toggles_are_remembered(tmp_path) -> None:
    app = LoopChatApp(FakeBackend(), prefs=Prefs(), prefs_path=tmp_path / "p.json")
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "hello")
        rec = app.conversation.replies[0]
        assert rec.text == "Hello, world! How are you?"
        assert "Forward pass 9" in panel_text(app)
        await pilot.press("f3", "f6")
        assert load_prefs(tmp_path / "p.json") == Prefs(streaming=False, token_boundaries=True)
        # keyboard token cursor: the last token of the last reply, then one back
        await pilot.press("alt+left", "alt+left")
        assert app.selection == (1, 6)
        assert "selected token of reply 1" in panel_text(app)
        await pilot.press("escape")
        assert app.selection is None


async def test_error_gives_the_prompt_back(tmp_path) -> None:
    app = LoopChatApp(
        FakeBackend(fail="the message is too long for the context"), prefs=Prefs(), prefs_path=tmp_path / "p.json"
    )
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(*"a long prompt", "enter")
        await wait_for(pilot, lambda: app.last_error is not None, 10, "the error")
        await pilot.pause()
        assert app.prompt.value == "a long prompt"
        assert app.conversation.replies == [] and app.conversation.turns == []
        assert not app.transcript.blocks
        # the app keeps running: the next attempt works
        app.backend.fail = None
        await pilot.press("enter")
        await wait_run(pilot)
        assert app.conversation.replies[0].text


async def test_settings_dialog_validates(tmp_path) -> None:
    app = LoopChatApp(FakeBackend(), prefs=Prefs(), prefs_path=tmp_path / "p.json")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("f2")
        await pilot.pause()
        dialog = app.screen
        temp = dialog.query_one("#set-temperature")
        temp.value = "9"
        await pilot.pause()
        assert "between" in str(dialog.query_one("#err-temperature").render())
        dialog.action_apply()
        await pilot.pause()
        assert app.screen is dialog  # not accepted
        temp.value = "1.25"
        dialog.query_one("#set-top_k").value = "12"
        await pilot.pause()
        dialog.action_apply()
        await pilot.pause()
        assert app.session.in_force().temperature == 1.25 and app.session.in_force().top_k == 12


async def test_knob_keys(tmp_path) -> None:
    app = LoopChatApp(FakeBackend(), prefs=Prefs(), prefs_path=tmp_path / "p.json")
    async with app.run_test(size=(120, 40)) as pilot:
        t0 = app.session.in_force().temperature
        await pilot.press("ctrl+up")
        assert app.session.in_force().temperature == round(t0 + 0.1, 2)
        await pilot.press("f8", "ctrl+down")  # top_p
        assert app.session.in_force().top_p == 0.9
        await pilot.press("f8", "f8", "f8")  # back to temperature
        await pilot.press(*["ctrl+down"] * 10)  # its floor is 0
        assert app.session.in_force().temperature == 0.0


@pytest.mark.slow
async def test_transcript_follows_the_reply_until_the_user_scrolls_up(tmp_path) -> None:
    words = [f" word{i}" if i % 9 else f"\nline{i}" for i in range(1500)]
    backend = FakeBackend(tokens=words, delay=0.004)
    app = LoopChatApp(backend, prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json")
    async with app.run_test(size=(100, 30)) as pilot:
        t = app.transcript
        await pilot.press(*"go", "enter")
        await wait_for(pilot, lambda: t.max_scroll_y > 20, 20, "the reply to outgrow the view")
        # following: after a frame the view is at the end again (while the reply grows by
        # several lines a frame, a check between two frames may see it a line or two short;
        # a view that does not follow never gets back there)
        await wait_for(
            pilot,
            lambda: (
                t.scroll_y >= t.max_scroll_y - 1 and t._total - (t.scroll_y + t.scrollable_content_region.height) <= 0
            ),
            5,
            "the view at the end",
        )
        t.focus()
        await pilot.press("pageup")
        await pilot.pause()
        held = t.scroll_y
        assert held < t.max_scroll_y
        grown = t.max_scroll_y
        await wait_for(pilot, lambda: t.max_scroll_y > grown + 12, 20, "more lines")
        assert t.scroll_y == held  # scrolled up: it stays where the user put it
        await pilot.press("end")
        await wait_run(pilot, 30)
        await pilot.pause()
        assert t.scroll_y == t.max_scroll_y  # back at the end: following again


async def test_clicking_a_token_shows_its_step(tmp_path) -> None:
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "hello")
        await pilot.pause()
        t = app.transcript
        view = t.reply_views()[0]
        start = t._starts[t.blocks.index(view)]
        # the body's first line: "│ Hello, world! How are you?" — click " world" (step 2)
        y = start + 2 - int(t.scroll_y)
        line = view.line(2).text
        x = line.index("world") + 1  # +1: the transcript's left padding
        await pilot.click(t, offset=(x, y))
        await pilot.pause()
        assert app.selection == (1, 2)
        assert "Forward pass 3" in panel_text(app) and "selected token of reply 1" in panel_text(app)
        assert app.focused is t  # the click focused the transcript: what is typed next went nowhere
        await pilot.press(*"and you?")
        await pilot.pause()
        assert app.prompt.value == "and you?" and app.focused is app.prompt
        await pilot.press("enter")  # sent, as typed
        await wait_run(pilot)
        assert app.conversation.turns[-2].content == "and you?"


async def test_typing_in_the_document_view_goes_to_the_message_box(tmp_path) -> None:
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "hello")
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        assert app.document.display and app.focused is app.document.body
        await pilot.press("right")  # the document's cursor keys stay its own
        await pilot.press(*"next")  # (the keys went nowhere)
        await pilot.pause()
        assert app.prompt.value == "next" and app.focused is app.prompt and app.document.display
        await pilot.press("enter")
        await wait_run(pilot)
        assert app.conversation.turns[-2].content == "next"


@pytest.mark.slow
async def test_ctrl_c_stops_a_reply_and_keeps_what_the_user_typed(tmp_path) -> None:
    backend = FakeBackend(tokens=[f" t{i}" for i in range(2000)], delay=0.005)
    app = LoopChatApp(backend, prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"first", "enter")
        await wait_for(pilot, lambda: app.steps_seen >= 5, 10, "tokens")
        await pilot.press(*"draft of my next message")
        await pilot.press("ctrl+c")
        await wait_run(pilot, 10)
        rec = app.conversation.replies[0]
        assert rec.finish is not None and rec.finish.reason.value == "cancelled"
        assert app.prompt.value == "draft of my next message"
        assert app.is_running  # Ctrl+C stopped the reply, not the app


async def test_a_token_that_arrives_alone_is_drawn_by_the_next_frame(tmp_path, monkeypatch) -> None:
    """The transcript draws new tokens every TEXT_EVERY-th frame; a token with nothing
    after it (a slow model) must not wait for the next one. With TEXT_EVERY huge, only
    that rule can draw the tokens before the reply ends: the backend holds after each
    token until the test has seen it drawn."""
    import threading

    from loopchat.events import Step
    from loopchat.tui import shell  # the app's frame timer

    monkeypatch.setattr(shell, "TEXT_EVERY", 10_000)
    words = ["One", " two", " three"]
    app = LoopChatApp(FakeBackend(tokens=words, delay=0.0), prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json")
    go = [threading.Event() for _ in words]

    def drawn() -> str:
        view = app.transcript.reply_views()[-1]
        return "".join(view.line(i).text for i in range(view.height))

    async with app.run_test(size=(120, 40)) as pilot:
        sink = app.pump.emit

        def emit(event: object) -> None:
            sink(event)
            if isinstance(event, Step) and event.index < len(words):
                go[event.index].wait(60)  # nothing after this token until it is drawn

        app.backend.attach(emit)
        await pilot.press(*"hi", "enter")
        for n, word in enumerate(words, 1):
            await wait_for(pilot, lambda n=n: app.current is not None and len(app.current.steps) >= n, 10, f"step {n}")
            await wait_for(pilot, lambda w=word: w in drawn(), 10, f"{word!r} drawn while it is the last token")
            assert not app.current.done
            go[n - 1].set()
        await wait_run(pilot)
        assert "One two three" in drawn()


@pytest.mark.slow
async def test_frames_leave_no_strips_for_the_cycle_collector(tmp_path) -> None:
    """A collection pauses the UI thread (and, with the engine in a thread, the loop).
    Painted lines must be freed by reference counting: Textual's Strip.divide and
    adjust_cell_length cache a strip in itself when they return it unchanged, and the
    compositor called them for every line it painted (~4 cyclic strips a token)."""
    app = LoopChatApp(
        FakeBackend(tokens=[f" w{i}" for i in range(120)], delay=0.01),
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "p.json",
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "warm up")  # first paints fill long-lived caches
        frames = app.frames_rendered
        with cyclic_garbage() as found:
            await reply_to(pilot, "again")
        assert app.frames_rendered - frames >= 10
        assert found["Strip"] < 10, found


async def test_a_trace_cut_short_plays_to_an_end(tmp_path) -> None:
    """A trace whose last reply has no finish event (a crash while recording) used to
    play as 'generating' forever."""
    from tui_fixtures import REPLY_TRACE

    from loopchat.trace import CUT_SHORT
    from loopchat.tui.launch import create_app

    lines = REPLY_TRACE.read_text(encoding="utf-8").splitlines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:-3]) + "\n", encoding="utf-8")  # no finish, a few steps short
    app = create_app(replay=str(cut), replay_speed=0, prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_run(pilot, 10)
        rec = app.conversation.replies[0]
        assert rec.done and not app.generating
        assert rec.finish.error == CUT_SHORT and app.last_error == CUT_SHORT
        assert "cut short" in str(app.transcript.reply_views()[0].info_text())
