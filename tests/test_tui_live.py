"""Pilot tests of the real app on the real default model (loaded once for the module)."""

from __future__ import annotations

import pytest
from tui_fixtures import StepGate, drawn, panel_text, wait_for, wait_run

from loopchat.backends.live import LiveBackend
from loopchat.chat.prefs import Prefs
from loopchat.events import FinishReason
from loopchat.settings import SamplingSettings
from loopchat.tui.launch import create_app

pytestmark = pytest.mark.model

SIZE = (120, 40)
PROMPT = "Write a short poem about the sea."


@pytest.fixture(scope="module")
def backend(live_backend):
    return live_backend  # the session's (conftest.py): loaded once for every chat module


def make_app(backend, tmp_path, **settings):
    base = dict(seed=42, max_tokens=32, temperature=0.8)
    base.update(settings)
    return create_app(
        backend=backend,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "prefs.json",
        settings=SamplingSettings(**base),
    )


async def send(pilot, text: str) -> None:
    await wait_for(pilot, pilot.app.model_ready.is_set, 30, "the model")
    await pilot.press(*text, "enter")


async def test_tokens_arrive_in_transcript_and_panel(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path, max_tokens=48)
    async with app.run_test(size=SIZE) as pilot:
        gate = StepGate(app, after=3)
        await send(pilot, PROMPT)
        # tokens show up while the reply is still being generated (held after 3 steps)
        await wait_for(pilot, lambda: app.steps_seen >= 3, 30, "the first steps")
        view = app.transcript.reply_views()[0]
        so_far = "".join(s.text for s in app.current.steps).strip()
        await wait_for(pilot, lambda: so_far.split()[0] in drawn(view), 5, "the text drawn")
        assert gate.holding and not app.current.done
        assert "Forward pass 3 · generating" in panel_text(app)
        gate.release()
        await wait_run(pilot)
        rec = app.conversation.replies[0]
        assert rec.finish is not None and rec.finish.text
        assert len(rec.steps) == rec.finish.steps
        assert rec.text == "".join(s.text for s in rec.steps)
        assert str(view.body_text()).strip() == rec.finish.text.strip()
        text = panel_text(app)
        assert f"Forward pass {rec.finish.steps}" in text
        assert "tok/s" in text and "context" in text
        assert "threads     1 pinned" in text  # LiveBackend(threads=1): the count of every pass
        assert {s.threads for s in rec.steps} == {1}
        assert "TTFT" in str(view.info_text())
        assert app.prompt.value == ""


async def test_stop_mid_reply(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path, max_tokens=400)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, "Tell me a very long story about a dragon and a knight.")
        await wait_for(pilot, lambda: app.steps_seen >= 5, 30, "5 steps")
        await pilot.press("escape")
        await wait_run(pilot, 10)
        rec = app.conversation.replies[0]
        assert rec.finish.reason == FinishReason.CANCELLED
        assert rec.finish.completion_tokens < 400
        assert "stopped (cancelled)" in str(app.transcript.reply_views()[0].info_text())
        # the partial reply stays in the conversation; the app takes the next prompt
        assert app.conversation.turns[-1].content == rec.finish.text


async def test_temperature_change_applies_at_the_next_step(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path, temperature=0.8)  # (32 tokens: the gate holds it at its 4th step)
    async with app.run_test(size=SIZE) as pilot:
        gate = StepGate(app, after=4)
        await send(pilot, "Tell me a very long story about a dragon and a knight.")
        await wait_for(pilot, lambda: app.steps_seen >= 4, 30, "4 steps")
        await pilot.press("ctrl+up")  # while the loop is held after its 4th step
        assert gate.holding and not app.current.done
        emitted = app.change_made_after_steps  # steps emitted when the key was handled
        assert emitted == 4
        assert app.session.in_force().temperature == 0.9
        gate.release()
        await wait_run(pilot)
        rec = app.conversation.replies[0]
        changed = [s.index for s in rec.steps if "temperature" in s.settings_changed]
        assert len(changed) == 1, (changed, emitted, rec.finish)
        k = changed[0]
        # the loop reads the settings at the top of each step: the change shows at the
        # step that started next after the key press
        assert k == emitted, (emitted, k)
        assert all(s.settings.temperature == 0.8 for s in rec.steps[:k])
        assert all(s.settings.temperature == 0.9 for s in rec.steps[k:])
        assert f"changed at pass {k + 1}" in panel_text(app)


async def test_blocking_mode_shows_nothing_until_the_end_then_the_same_text(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path, max_tokens=40)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, PROMPT)
        await wait_run(pilot)
        streamed = app.conversation.replies[0]
        # the same conversation, seed and settings in the other mode (F9)
        gate = StepGate(app, after=3)
        await pilot.press("f9")
        await wait_for(pilot, lambda: app.steps_seen >= len(streamed.steps) + 3, 30, "steps of the replay")
        replay = app.conversation.replies[1]
        view = app.transcript.reply_views()[1]
        assert replay.mode == "blocking" and not replay.in_history
        await pilot.pause(0.2)  # a few frames: nothing of the text may appear
        assert gate.holding and not replay.done
        # the seconds counter runs while the caller waits
        await wait_for(pilot, lambda: " · 0.0 s" not in drawn(view), 5, "the waiting time to count")
        shown = drawn(view)
        assert "waiting for the whole reply" in shown
        assert streamed.text[:10] not in shown
        assert "blocking mode" in panel_text(app)
        gate.release()
        await wait_run(pilot)
        assert replay.finish.text == streamed.finish.text
        assert str(view.body_text()).strip() == streamed.finish.text.strip()
        assert "whole reply shown after" in str(view.info_text())
        # the replay is not part of the conversation
        assert len(app.conversation.turns) == 2


async def test_blocking_toggle_for_new_replies(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path, max_tokens=24)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f3")
        assert app.prefs.streaming is False
        gate = StepGate(app, after=2)
        await send(pilot, "Hi!")
        await wait_for(pilot, lambda: app.steps_seen >= 2, 30, "two steps")
        await pilot.pause(0.2)  # a few frames
        assert gate.holding and not app.current.done
        view = app.transcript.reply_views()[0]
        assert "waiting" in drawn(view)
        assert "".join(st.text for st in app.current.steps).strip() not in drawn(view)
        gate.release()
        await wait_run(pilot)
        rec = app.conversation.replies[0]
        assert rec.mode == "blocking" and rec.finish.text
        assert str(view.body_text()).strip() == rec.finish.text.strip()


async def test_each_frame_takes_what_the_engine_process_sent(tmp_path, monkeypatch) -> None:
    """The app's frames read the engine process's pipe themselves: with the reader thread
    asleep for an hour after its first read, the model still loads and a reply streams."""
    from loopchat.backends import live as backend_module

    monkeypatch.setattr(backend_module, "READ_PERIOD", 3600.0)
    b = LiveBackend(None, None, threads=1, host="process")
    try:
        app = make_app(b, tmp_path, max_tokens=8)
        async with app.run_test(size=SIZE) as pilot:  # the app loads the model
            await send(pilot, PROMPT)
            await wait_run(pilot, timeout=60)
            assert app.conversation.replies[0].finish.completion_tokens > 0
    finally:
        b.close()


async def test_the_panel_says_the_prompt_is_being_read_until_the_first_pass_ends(backend, tmp_path) -> None:
    """Between Enter and the first token the panel showed the welcome text (a reopened
    conversation's prefill takes seconds): it now says what runs, with the prompt's size,
    then the prefill's figures. The backend is held after each of those events."""
    import threading

    from loopchat.events import Prefill, Start

    app = make_app(backend, tmp_path, max_tokens=8)
    held = {Start: threading.Event(), Prefill: threading.Event()}
    seen: list[type] = []
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await send(pilot, "Hi!")  # a reply before: the panel must not keep showing it either
        await wait_run(pilot)
        sink = app.pump.emit

        def emit(event) -> None:
            sink(event)
            if type(event) in held:
                seen.append(type(event))
                held[type(event)].wait(60)

        app.backend.attach(emit)
        await pilot.press(*"Tell me about the sea.", "enter")
        await wait_for(pilot, lambda: seen == [Start] and app.current.start is not None, 30, "the start")
        await wait_for(pilot, lambda: "reading the prompt" in panel_text(app), 5, "the panel to say so")
        text = panel_text(app)
        n = len(app.current.start.prompt_token_ids)
        assert "Forward pass 1 · reading the prompt" in text and f"prompt {n:,} tokens (context 4,096)" in text
        assert "Send a message" not in text and "(its first draw)" in text and "Forward pass 2" not in text
        assert "\n\n\n" not in text.split("Sampling settings")[0]  # one blank line before the settings
        held[Start].set()
        await wait_for(pilot, lambda: seen == [Start, Prefill] and app.current.prefill is not None, 30, "the prefill")
        p = app.current.prefill
        await wait_for(
            pilot,
            lambda: f"prefill {p.prompt_tokens:,} tokens, {p.reused_tokens:,} reused" in panel_text(app),
            5,
            "the prefill's figures",
        )
        held[Prefill].set()
        await wait_run(pilot)
        assert "Forward pass" in panel_text(app) and "reading the prompt" not in panel_text(app)
