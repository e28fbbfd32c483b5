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
