"""Issue 24, item 3 in the chat: the palette's Constraint… sets a JSON schema for the next
replies; the reply follows it, the loop panel shows the constraint's rows at each pass
(allowed count, forbidden mass, the token the model wanted, the forced mark), the reply's
info line its forced passes and forbidden mass, and Ctrl+F7 marks the forced tokens.
Through Textual's Pilot, the real default model."""

from __future__ import annotations

import json

import pytest
from tui_fixtures import model_app, palette_pick, panel_text, record_notices, wait_for, wait_run

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
