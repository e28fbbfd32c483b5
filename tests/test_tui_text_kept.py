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
