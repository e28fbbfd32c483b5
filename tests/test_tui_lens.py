"""F11: the logit lens of the pass the panel shows, in the chat (issue 26, part 1): the pass
re-read with the lens when asked, on a screen of its own; its last layer is the pass's own
raw softmax; the conversation is left as it was. Through Textual's Pilot, the real model."""

from __future__ import annotations

import pytest
from tui_fixtures import model_app, wait_for, wait_run

from loopchat.chat.lens_depth import lens_depth
from loopchat.tui.lens_screen import LensScreen
from loopchat.tui.token_styles import depth_colour

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def backend(live_backend):
    return live_backend  # the session's (conftest.py): loaded once for every chat module


async def test_f11_shows_each_layer_of_the_selected_pass(backend, tmp_path) -> None:
    app = model_app(backend, tmp_path, seed=4, max_tokens=5, temperature=0.7)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await pilot.press(*"The capital of France is", "enter")
        await wait_run(pilot)
        rec = app.conversation.replies[0]
        steps_before = list(rec.steps)
        await pilot.press("alt+left", "alt+left")  # the reply's last token but one
        await pilot.pause()
        reply, index = app.selection
        step = next(s for s in rec.steps if s.index == index)
        await pilot.press("f11")
        await wait_for(pilot, lambda: isinstance(app.screen, LensScreen), 5, "the lens screen")
        screen = app.screen
        await wait_for(pilot, lambda: screen.probe.done and screen.shown_done, 60, "the lens")
        rows = screen.probe.rows
        assert rows is not None and len(rows) == 30  # SmolLM2-135M's layers
        last = rows[-1]
        assert last.top_id == step.raw_top[0].token_id and last.top_prob == pytest.approx(
            step.raw_top[0].prob, abs=1e-5
        )
        assert last.drawn_rank == step.raw_rank and last.drawn_prob == pytest.approx(step.raw_prob, abs=1e-5)
        text = screen.text
        assert f"reply {reply}, pass {index + 1} · drew {step.piece!r}" in text
        assert f"   29  {last.top_text!r:<18}{last.top_prob:6.3f}" in text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, LensScreen)
        # the probe's run is not a reply: the conversation is as it was
        assert len(app.conversation.replies) == 1 and rec.steps == steps_before
        # Alt+L, the same (F11 is the full screen of many terminals and of browsers)
        await pilot.press("alt+l")
        await wait_for(pilot, lambda: isinstance(app.screen, LensScreen), 5, "the lens screen (Alt+L)")
        again = app.screen
        await wait_for(pilot, lambda: again.probe.done and again.shown_done, 60, "the lens (Alt+L)")
        assert again.probe.rows is not None and again.probe.rows[-1].top_id == last.top_id
        await pilot.press("alt+l")
        await pilot.pause()
        assert not isinstance(app.screen, LensScreen)


def _colours(view) -> set[str]:
    """The foreground colours of a reply view's rendered lines."""
    out = set()
    for i in range(view.height):
        for seg in view.line(i):
            if seg.style is not None and seg.style.color is not None:
                out.add(seg.style.color.name)
    return out


async def test_shift_f7_colours_each_token_by_its_lens_depth_and_a_message_goes_first(backend, tmp_path) -> None:
    app = model_app(backend, tmp_path, seed=4, max_tokens=6, temperature=0.7)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await pilot.press(*"The capital of France is", "enter")
        await wait_run(pilot)
        rec = app.conversation.replies[0]
        tokens = [s for s in rec.steps if not s.is_stop]
        await pilot.press("shift+f7")
        assert app.prefs.lens_colours and not app.prefs.prob_colours
        probe = app.depth_probe
        await wait_for(pilot, lambda: probe.done and not probe.changed, 60, "the lens depths")
        assert rec.lens_layers == 30 and sorted(rec.lens_depths) == [s.index for s in tokens]
        legend = app.query_one("#legend")
        assert legend.display and "top from layer" in str(legend.render())
        # each token in its depth's colour
        want = {depth_colour(rec.lens_depths[s.index], 30) for s in tokens}
        assert want <= _colours(app.replies.get(rec))
        # a depth is F11's rows' (the pass read alone, as F11 reads it)
        await pilot.press("alt+left")
        await pilot.pause()
        index = app.selection[1]
        await pilot.press("f11")
        await wait_for(pilot, lambda: isinstance(app.screen, LensScreen), 5, "the lens screen")
        screen = app.screen
        await wait_for(pilot, lambda: screen.probe.done, 60, "the lens")
        assert lens_depth(screen.probe.rows) == rec.lens_depths[index]
        await pilot.press("escape", "alt+right")  # (off the end: nothing selected)
        # a longer reply: its depths are read once it ends; a message sent meanwhile goes
        # first (the reading stops; its depths so far stay) and nothing typed is lost
        assert app.set_setting(max_tokens=60)
        await pilot.press(*"Tell me a story", "enter")
        await wait_run(pilot)
        second = app.conversation.replies[-1]
        await wait_for(pilot, lambda: len(second.lens_depths) >= 1, 60, "the second reply's first depths")
        # off and on again while it reads: the reading stops (its run's last events are still
        # its own, not a turn of the conversation) and a new one goes on from there
        first_reading = app.depth_probe
        await pilot.press("shift+f7", "shift+f7")
        reading = app.depth_probe
        assert reading is not first_reading and reading.rec is second and app.prefs.lens_colours
        await wait_for(pilot, lambda: first_reading.done, 30, "the first reading's end")
        assert len(app.conversation.replies) == 2 and not reading.done
        app.set_setting(max_tokens=3)
        app.prompt.value = "Thanks"  # (at once: the reading of 60 passes has just begun)
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.replies) == 3, 10, "the third reply")
        await wait_run(pilot)
        third = app.conversation.replies[-1]
        assert third.messages[-1].content == "Thanks" and third.finish is not None
        assert reading.done and len(second.lens_depths) < len([s for s in second.steps if not s.is_stop])
        assert "stopped" in reading.status
        # the third reply's depths are read once it ended
        await wait_for(pilot, lambda: app.depth_probe.rec is third and app.depth_probe.done, 60, "the third's depths")
        assert len(third.lens_depths) == len([s for s in third.steps if not s.is_stop])
        await pilot.press("shift+f7")  # off: no colours, no legend
        assert not app.prefs.lens_colours and not legend.display
        assert not want & _colours(app.replies.get(rec))
