"""Keys that do what they say, and text that is never lost or reordered (issue 22, §3):
the token cursor never stops a reply, Ctrl+Q asks before a draft is lost, PgUp/PgDn
scroll the transcript from the message box, Esc during the prompt read gives the
message back without keeping it in the conversation, completion mode's space."""

from __future__ import annotations

from tui_fixtures import FakeBackend, StepGate, fake_app, reply_to, wait_for, wait_run

from loopchat.events import FinishReason


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
    from textual import events
    from test_tui_branch import notices

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


async def test_page_keys_in_the_box_scroll_the_transcript(tmp_path) -> None:
    backend = FakeBackend(tokens=[f"line {i}\n" for i in range(120)], delay=0.0)
    app = fake_app(tmp_path, backend)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "Count.")
        t = app.transcript
        await wait_for(pilot, lambda: t.max_scroll_y > 2 * t.size.height and t.scroll_y == t.max_scroll_y, 10, "the end")
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
