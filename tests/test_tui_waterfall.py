"""The loop panel's waterfall (issue 24) and the logit bias's F2 field, in the chat on the
real default model (Textual's Pilot)."""

from __future__ import annotations

import pytest
from tui_fixtures import model_app, panel_text, reply_to, wait_for

from loopchat.chat.plots import fmt_prob
from loopchat.tui.settings_dialog import SettingsDialog

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def backend(live_backend):
    return live_backend  # the session's (conftest.py): loaded once for every chat module


def make_app(backend, tmp_path):
    return model_app(backend, tmp_path, seed=42, max_tokens=6, temperature=0.8, min_p=0.0)


async def test_the_panel_shows_the_waterfall_and_f2_sets_the_logit_bias(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path)
    async with app.run_test(size=(120, 70)) as pilot:  # tall: the whole waterfall has room
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await reply_to(pilot, "Name a fruit.")
        step = app.conversation.replies[-1].steps[-1]
        text = panel_text(app)
        assert "Sampler, stage by stage" in text, text
        top_k = next(r for r in step.stages if r.stage == "top_k")
        assert f"{'top-k 40':<14}{top_k.kept:>7,} {fmt_prob(top_k.removed_mass):>7}  " in text, text
        assert "min-p 0       did nothing" in text and "temp 0.8      divides the logits by 0.8" in text
        first = app.conversation.replies[-1].steps[0]
        # a selected token's pass shows its own waterfall
        await pilot.press("alt+left", "alt+left")
        await pilot.pause()
        shown = app.panel.view.step
        assert shown is not None and shown.index < step.index and app.panel.view.pinned
        top_k = next(r for r in shown.stages if r.stage == "top_k")
        assert f"{'top-k 40':<14}{top_k.kept:>7,} {fmt_prob(top_k.removed_mass):>7}  " in panel_text(app)
        await pilot.press("alt+right", "alt+right")  # off the end: the live pass again
        await pilot.pause()
        assert not app.panel.view.pinned
        # F2: the logit bias, typed: a token id banned, a text boosted (the model's first token of it)
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsDialog), 5, "the dialog")
        field = app.screen.query_one("#set-logit_bias")
        field.value = "7=hot"  # a bad entry: one line that says what to write
        await pilot.pause()
        assert "not a number" in str(app.screen.query_one("#err-logit_bias").render())
        field.value = f'{first.token_id}=-100, " banana"=5'
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, SettingsDialog), 5, "the dialog to close")
        banana = backend.tokenizer().first_token(" banana")
        assert app.session.in_force().logit_bias == tuple(sorted([(first.token_id, -100.0), (banana, 5.0)]))
        await pilot.press("f2")  # the field shows the tokens by their texts where they round-trip
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsDialog), 5, "the dialog")
        assert '" banana"=5' in app.screen.query_one("#set-logit_bias").value
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, SettingsDialog), 5, "the dialog to close")
        await reply_to(pilot, "Name a fruit.")
        steps = app.conversation.replies[-1].steps
        assert steps[0].settings.logit_bias and steps[0].token_id != first.token_id  # banned at the first pass
        bias = steps[0].stages[2]
        assert (bias.stage, bias.changed) == ("logit_bias", 2)
        assert f"{'bias 2 tok':<14}changed 2 logits · moved" in panel_text(app)


async def test_on_a_short_panel_the_waterfall_gives_way_first(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await reply_to(pilot, "Name a fruit.")
        text = panel_text(app)
        assert "Sampler, stage by stage" not in text and "sampler top-k −" in text, text
        assert "top 3 " not in text  # the candidates have not given way to their last 3


async def test_the_narrow_screens_panel_keeps_the_sampler_in_one_line(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:  # the panel below the transcript: 8 lines
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await reply_to(pilot, "Name a fruit.")
        view = app.panel.view
        assert view.compact and view.height == 8
        text = panel_text(app)
        assert any("sampler top-k −" in line for line in text.splitlines()[:8]), text  # in view


async def test_step_modes_die_shows_its_waterfall_reshaped_by_a_change(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path)
    async with app.run_test(size=(120, 70)) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await pilot.press("f12")
        await pilot.press(*"Name a fruit.", "enter")
        s = app.session
        await wait_for(pilot, lambda: s.stopped and s.pending is not None, 30, "stopped before the first draw")
        await pilot.pause()
        assert "Sampler, stage by stage" in panel_text(app)
        assert f"{'temp 0.8':<14}divides the logits by 0.8" in panel_text(app)
        await pilot.press("ctrl+up")  # the temperature: the same logits, the die reshaped
        await wait_for(pilot, lambda: s.pending is not None and s.pending.settings.temperature == 0.9, 10, "0.9")
        await pilot.pause()
        assert f"{'temp 0.9':<14}divides the logits by 0.9" in panel_text(app)
        await pilot.press("escape")
