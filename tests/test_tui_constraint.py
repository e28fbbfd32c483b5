"""Issue 24, item 3 in the chat: the palette's Constraint… sets a JSON schema for the next
replies; the reply follows it, the loop panel shows the constraint's rows at each pass
(allowed count, forbidden mass, the token the model wanted, the forced mark), the reply's
info line its forced passes and forbidden mass, and Ctrl+F7 marks the forced tokens.
Through Textual's Pilot, the real default model."""

from __future__ import annotations

import json

import pytest
from tui_fixtures import drawn, model_app, palette_pick, panel_text, record_notices, wait_for, wait_run

from loopchat.chat.plots import fmt_prob
from loopchat.tui.constraint_dialog import ConstraintDialog
from loopchat.tui.token_styles import FORCED_COLOUR, token_style

pytestmark = pytest.mark.model

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "sunny": {"type": "boolean"}},
    "required": ["city", "sunny"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def backend(live_backend):
    return live_backend  # the session's (conftest.py): loaded once for every chat module


async def test_a_schema_set_in_the_palette_shapes_the_reply_and_the_panel_shows_it(backend, tmp_path) -> None:
    schema = tmp_path / "weather.json"
    schema.write_text(json.dumps(SCHEMA))
    bad = tmp_path / "bad.gbnf"
    bad.write_text('root ::= "a" | b\n')
    app = model_app(backend, tmp_path, seed=2, max_tokens=40, temperature=0.7)
    async with app.run_test(size=(130, 50)) as pilot:
        notices = record_notices(app)
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        # a bad file: one line under the field, the dialog stays open
        await palette_pick(pilot, "Constraint")
        await wait_for(pilot, lambda: isinstance(app.screen, ConstraintDialog), 5, "the constraint dialog")
        await pilot.press(*str(bad), "enter")
        await pilot.pause()
        assert isinstance(app.screen, ConstraintDialog)
        hint = str(app.screen.query_one("#constraint-hint").render())
        assert f"grammar {bad}: line 1, column 16: rule 'b' is used and not defined" in hint
        app.screen.query_one("#constraint-input").value = ""
        await pilot.press(*str(schema), "enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConstraintDialog), 5, "the dialog to close")
        assert "Next replies follow: JSON schema weather.json" in notices
        await pilot.press(*"Weather in Paris as JSON?", "enter")
        await wait_run(pilot)
        rec = app.conversation.replies[0]
        value = json.loads(rec.finish.text)
        assert set(value) == {"city", "sunny"}
        forced = [s for s in rec.steps if s.constraint is not None and s.constraint.forced]
        assert forced  # the keys' names are forced once the structure starts
        # the panel at a forced pass: its rows, its figures
        step = forced[0]
        for _ in range(len(rec.steps) + 2):  # the token cursor back to that pass (Alt+←)
            await pilot.press("alt+left")
            await pilot.pause()
            if app.selection is not None and app.selection[1] == step.index:
                break
        assert app.selection == (rec.number, step.index)
        text = panel_text(app, 60)
        r = step.constraint
        assert "constraint  1 of 49,152 tokens allowed" in text
        assert f"forbidden   {fmt_prob(r.forbidden_mass)} of the raw mass" in text
        assert "forced      the model had no say" in text
        if r.top_forbidden_id >= 0:
            assert f"{fmt_prob(r.top_forbidden_prob)} raw (forbidden)" in text
        # the info line: forced passes and the forbidden mass in all
        total = sum(s.constraint.forbidden_mass for s in rec.steps)
        info = f"constraint: {len(forced)} of {len(rec.steps)} passes forced, forbidden mass {total:.3f} in all"
        info += f" ({total / len(rec.steps):.3f} a pass)"
        assert info in app.replies.get(rec).info_text().plain

        # Ctrl+F7: the forced tokens marked in the transcript
        def colour(s) -> str | None:
            style = token_style(s, 0, app.prefs, False)
            return None if style is None or style.color is None else style.color.name

        assert colour(step) != FORCED_COLOUR
        await pilot.press("ctrl+f7")
        await pilot.pause()
        assert app.prefs.forced_marks and "marked (blue italics)" in notices[-1]
        assert colour(step) == FORCED_COLOUR and token_style(step, 0, app.prefs, False).italic
        free = next(s for s in rec.steps if not s.constraint.forced)
        assert colour(free) != FORCED_COLOUR


async def test_a_model_s_json_schema_from_models_toml_shapes_the_chat_s_replies(tmp_path) -> None:
    """models.toml's json_schema for the model: the chat's replies follow it from the first
    (the palette's Constraint… shows it, and can clear it)."""
    from loopchat.backends.live import LiveBackend
    from loopchat.config import load_config

    (tmp_path / "weather.json").write_text(json.dumps(SCHEMA))
    toml = tmp_path / "models.toml"
    toml.write_text('[models.shaped]\nbuiltin = "smollm2-135m-instruct"\njson_schema = "weather.json"\n')
    b = LiveBackend(load_config(toml), "shaped", threads=1)
    app = model_app(b, tmp_path, seed=2, max_tokens=40, temperature=0.7)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, app.model_ready.is_set, 60, "the model")
            assert app.session.constraint is not None and app.session.constraint.kind == "json_schema"
            await pilot.press(*"The weather in Paris?", "enter")
            await wait_run(pilot)
            rec = app.conversation.replies[-1]
            assert all(s.constraint is not None for s in rec.steps)
            reply = json.loads(rec.finish.text)
            assert set(reply) == {"city", "sunny"}
    finally:
        b.close()


async def set_constraint(pilot, value: str) -> None:
    """The palette's Constraint…: `value` typed in its field ("" clears it), Enter."""
    app = pilot.app
    await palette_pick(pilot, "Constraint")
    await wait_for(pilot, lambda: isinstance(app.screen, ConstraintDialog), 5, "the constraint dialog")
    app.screen.query_one("#constraint-input").value = value
    await pilot.press("enter")
    await wait_for(pilot, lambda: not isinstance(app.screen, ConstraintDialog), 5, "the dialog to close")


async def test_a_forbidden_token_picked_by_hand_is_refused_and_the_reply_and_turn_stay(backend, tmp_path) -> None:
    """Under a JSON constraint: in step mode a digit picking a candidate the grammar forbids is
    refused in one line and the loop still waits; Ctrl+R at a token with a forbidden pick (/ search)
    is refused in one line and the reply it was to replace stays, with its turn; the chat goes on."""
    from loopchat.tui.branch_picker import BranchPicker
    from loopchat.tui.step_mode import TokenSearch

    app = model_app(backend, tmp_path, seed=3, max_tokens=16, temperature=0.7)
    async with app.run_test(size=(120, 40)) as pilot:
        notices = record_notices(app)
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await set_constraint(pilot, "json")
        # step mode: the first draw's die; a raw candidate that is no JSON object's start
        await pilot.press("f12", *"Describe a cat in JSON.", "enter")
        await wait_for(pilot, lambda: app.session.stopped and app.session.pending is not None, 30, "the stop")
        pending = app.session.pending
        rank = next(i for i, c in enumerate(pending.raw_top, 1) if not c.text.lstrip().startswith("{"))
        face = pending.raw_top[rank - 1].text
        await pilot.press(str(rank))
        line = f"The any JSON object constraint does not allow {face!r} here: pick a token it allows, or draw (Enter)"
        await wait_for(pilot, lambda: line in notices, 10, "the refusal")
        assert app.session.stopped and app.session.pending is not None and app.current.steps == []
        await pilot.press("f12")  # runs freely: the reply follows the grammar
        await wait_run(pilot)
        (first,) = app.conversation.replies
        text = first.finish.text
        assert first.finish.error is None and text.startswith("{")
        # Ctrl+R at the first token, / and a token no JSON value can start with
        app.action_select_token(first.number, 0)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: isinstance(app.screen, BranchPicker), 5, "the branch picker")
        await pilot.press("slash")
        await wait_for(pilot, lambda: isinstance(app.screen, TokenSearch), 5, "the search")
        search = app.screen
        await pilot.press("]")
        await wait_for(pilot, lambda: bool(search.results), 5, "results")
        face = search.vocabulary[search.results[0]]
        await pilot.press("enter")
        await wait_run(pilot)
        refusal = f"the any JSON object constraint does not allow {face!r} here: pick a token it allows, or clear"
        assert any(refusal in n for n in notices), notices[-3:]
        assert app.conversation.replies == [first] and first.siblings == [first] and not first.hidden
        (view,) = app.transcript.reply_views()  # the reply, shown as before (no version 2/2)
        assert "version" not in view.line(1).text and text[:8] in drawn(view)
        assert [m.role for m in app.conversation.turns][-2:] == ["user", "assistant"]
        await pilot.press(*"And a dog?", "enter")  # the conversation goes on from it
        await wait_run(pilot)
        second = app.conversation.replies[-1]
        assert second is not first and second.messages[-2].content == text


async def test_f9_replays_a_reply_under_the_constraint_it_ran_under_not_the_one_set_now(backend, tmp_path) -> None:
    """F9's replay (same messages, seed and settings: the same tokens) under the reply's own
    constraint: a JSON reply replayed after the constraint was cleared, a free one after a
    constraint was set, each gives the same tokens (it said "the same seed drew other tokens")."""
    app = model_app(backend, tmp_path, seed=6, max_tokens=12, temperature=0.9)
    async with app.run_test(size=(120, 40)) as pilot:
        notices = record_notices(app)
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await set_constraint(pilot, "json")
        await pilot.press(*"Describe a cat in JSON.", "enter")
        await wait_run(pilot)
        shaped = app.conversation.replies[-1]
        assert shaped.constraint is not None and all(s.constraint is not None for s in shaped.steps)
        await pilot.press("shift+f5")  # four versions in one batch: each knows the constraint it ran under
        await wait_for(
            pilot, lambda: len(shaped.siblings) == 5 and all(r.done for r in shaped.siblings), 120, "the batch"
        )
        assert all(r.constraint == shaped.constraint for r in shaped.siblings)
        await pilot.press("alt+pageup")  # back from the batch's first (version 2) to the first version
        await pilot.pause()
        assert app.conversation.last_in_history() is shaped
        await set_constraint(pilot, "")
        assert app.session.constraint is None
        await pilot.press("f9")
        await wait_run(pilot)
        replay = app.conversation.replies[-1]
        assert replay.replay_of == shaped.number and replay.constraint == shaped.constraint
        assert [s.token_id for s in replay.steps] == [s.token_id for s in shaped.steps]
        await pilot.press(*"Now say hi.", "enter")  # a free reply, then a constraint set, F9
        await wait_run(pilot)
        free = app.conversation.replies[-1]
        assert free.constraint is None and free.replay_of is None
        await set_constraint(pilot, "json")
        await pilot.press("f9")
        await wait_run(pilot)
        again = app.conversation.replies[-1]
        assert again.replay_of == free.number and again.constraint is None
        assert all(s.constraint is None for s in again.steps)
        assert [s.token_id for s in again.steps] == [s.token_id for s in free.steps]
        assert not any("differs" in n for n in notices), [n for n in notices if "differs" in n]
