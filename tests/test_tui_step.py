"""Step mode in the chat (F12, the die bar's keys, the token search) on the real default
model, and its refusal on a replay."""

from __future__ import annotations

import pytest
from textual.widgets import Input, OptionList
from tui_fixtures import REPLY_TRACE, StepGate, drawn, panel_text, wait_for, wait_run

from loopchat.backends.live import LiveBackend
from loopchat.chat.plots import fmt_ms, fmt_prob, fmt_rate, show_token
from loopchat.chat.prefs import Prefs
from loopchat.events import FinishReason
from loopchat.settings import SamplingSettings
from loopchat.tui.launch import create_app
from loopchat.tui.prompt import PromptArea
from loopchat.tui.step_mode import DRAW_N, StepBar, TokenSearch

pytestmark = pytest.mark.model

SIZE = (120, 40)
PROMPT = "Name a fruit."


@pytest.fixture(scope="module")
def backend(live_backend):
    return live_backend  # the session's (conftest.py): loaded once for every chat module


def make_app(backend, tmp_path, **settings):
    base = dict(seed=42, max_tokens=40, temperature=0.8)
    base.update(settings)
    return create_app(
        backend=backend,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "prefs.json",
        settings=SamplingSettings(**base),
        history=False,
    )


async def stopped_at(pilot, index: int) -> None:
    """Wait until the loop is stopped before the draw of step `index`."""
    s = pilot.app.session
    await wait_for(pilot, lambda: s.stopped and s.pending.index == index, 30, f"stopped before step {index}")
    await pilot.pause()


async def armed_and_sent(pilot, text: str = PROMPT) -> None:
    app = pilot.app
    await wait_for(pilot, app.model_ready.is_set, 30, "the model")
    await pilot.press("f12")
    assert app.session.step_armed and app.step_bar.display
    await pilot.press(*text, "enter")
    await stopped_at(pilot, 0)


async def test_at_100_columns_the_stopped_line_is_cut_with_an_ellipsis_and_the_panel_full(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:  # the panel beside the transcript
        await armed_and_sent(pilot)
        view = app.views[app.current]
        last = drawn(view).splitlines()[-1]
        assert last.startswith("│ step mode: stopped before the first draw") and last.rstrip().endswith("…")
        assert len(last.rstrip()) <= view.width
        # after a draw the panel's rows are full: without the key list (the die bar under
        # it has the keys) the settings keep a line each (they went on one line, 3 rows left blank)
        await pilot.press("enter")
        await stopped_at(pilot, 1)
        lines = panel_text(app).rstrip("\n").split("\n")
        text = "\n".join(lines)
        assert "Settings of this draw" in text and "Enter draws" not in text, text
        assert "▸ temperature" in text and "seed" in text and len(lines) <= app.panel.view.height
        # a click on a token gives the transcript the focus: the die bar's keys still work
        t = app.transcript
        y = t._starts[t.blocks.index(view)] + 2 - int(t.scroll_y)
        await pilot.click(t, offset=(3, y))
        await pilot.pause()
        assert app.focused is t and app.selection == (app.current.number, 0)
        await pilot.press("enter")  # (it went nowhere)
        await stopped_at(pilot, 2)
        assert app.current.steps[1].chosen_by == "step" and app.prompt.text == ""
        await pilot.press("escape")
        await wait_run(pilot)


async def test_f12_arms_then_enter_n_digit_and_f12_again(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await armed_and_sent(pilot)
        rec = app.current
        assert rec.steps == [] and isinstance(app.focused, StepBar)
        # the transcript says the loop waits (it showed a spinner and a running clock)
        status = app.views[rec]._status.plain
        assert "stopped before the first draw" in status and "first token…" not in status
        text = panel_text(app)
        assert "Stopped before the draw of token 1" in text and "after sampling" in text
        assert "Step mode · stopped before token 1" in str(app.step_bar.render())

        app.clear_notifications()
        await pilot.press("h", "i")  # typing while stopped: it says where the keys go
        await pilot.pause()
        notes = [str(n.message) for n in app.notices]
        assert sum("typing does not go to the message box" in n for n in notes) == 1, notes  # once
        assert rec.steps == [] and app.prompt.text == ""

        await pilot.press("enter")  # one draw
        await stopped_at(pilot, 1)
        assert len(rec.steps) == 1 and rec.steps[0].chosen_by == "step"
        assert "Stopped before the draw of token 2" in panel_text(app)

        await pilot.press("n")  # ten draws
        await stopped_at(pilot, 1 + DRAW_N)
        assert [s.chosen_by for s in rec.steps] == ["step"] * (1 + DRAW_N)
        assert isinstance(app.focused, StepBar) and app.prompt.text == ""  # no key reached the box

        want = app.session.pending.raw_top[2]
        await pilot.press("3")  # the third candidate, by hand
        await stopped_at(pilot, 2 + DRAW_N)
        picked = rec.steps[-1]
        assert (picked.token_id, picked.chosen_by) == (want.token_id, "hand")
        assert picked.raw_prob == pytest.approx(want.prob, rel=1e-4)

        await pilot.press("f12")  # run freely to the end
        await wait_run(pilot)
        assert rec.finish.reason in (FinishReason.STOP, FinishReason.LENGTH)
        # the stops (the user's time) are left out of TTFT and tok/s, in the total, and said;
        # the panel's speed is the passes' own (forward + sampling) rate
        f = rec.finish
        assert f.paused_ms > 0 and f.ttft_ms < rec.steps[0].elapsed_ms
        assert (
            f"stopped {fmt_ms(f.paused_ms)} in step mode (in total, not in TTFT or tok/s)"
            in app.views[rec].info_text().plain
        )
        text = panel_text(app)
        assert f"{fmt_rate(f.tokens_per_s)} (whole reply, no stops)" in text, text
        assert "(step-mode stops left out)" in text
        assert all(s.chosen_by == "sampled" for s in rec.steps[2 + DRAW_N :])
        assert isinstance(app.focused, PromptArea) and not app.step_bar.display

        # the hand-picked token: underlined in the transcript, "picked by hand" in its panel
        view = app.views[rec]
        styled = view._styled_text()
        under = [styled.plain[sp.start : sp.end] for sp in styled.spans if getattr(sp.style, "underline", False)]
        assert under == [picked.text]
        app.action_select_token(rec.number, picked.index)
        await pilot.pause()
        assert "picked by hand" in panel_text(app)


async def test_a_setting_changed_while_stopped_reshapes_the_die(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path, temperature=0.5, top_k=0, top_p=1.0, min_p=0.0)
    async with app.run_test(size=SIZE) as pilot:
        await armed_and_sent(pilot)
        s = app.session
        before = s.pending
        passes = backend.worker._engine.passes
        await pilot.press("ctrl+up", "ctrl+up", "ctrl+up")  # temperature 0.5 -> 0.8
        await wait_for(
            pilot,
            lambda: s.pending is not None and s.pending.settings.temperature == pytest.approx(0.8),
            10,
            "the reshaped die",
        )
        after = s.pending
        assert after.index == before.index and after.raw_top == before.raw_top
        assert after.sampled_top[0].prob < before.sampled_top[0].prob  # a hotter die: flatter
        assert app.current.steps == [] and backend.worker._engine.passes == passes  # no forward pass
        await pilot.pause()
        assert "temperature" in panel_text(app) and "0.80" in panel_text(app)

        await pilot.press("escape")  # Esc while stopped ends the reply
        await wait_run(pilot)
        assert app.current is None or app.current.done
        assert isinstance(app.focused, PromptArea)


async def test_slash_searches_the_vocabulary_and_enter_picks(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await armed_and_sent(pilot)
        await pilot.press("slash")
        await wait_for(pilot, lambda: isinstance(app.screen, TokenSearch), 5, "the search")
        search = app.screen
        await pilot.press(*"apple")
        await wait_for(pilot, lambda: search.query_one(Input).value == "apple" and search.results, 5, "results")
        first = search.results[0]
        assert search.vocabulary[first].strip().startswith("apple")
        # one screen row a token: the rows fit the list (they wrapped to two), the columns aligned
        options = search.query_one(OptionList)
        width = options.scrollable_content_region.width - 2  # an option's own padding
        rows = [options.get_option_at_index(i).prompt for i in range(options.option_count)]
        assert rows and all(r.cell_len <= width for r in rows), (width, [r.cell_len for r in rows])
        assert len({r.cell_len for r in rows}) == 1
        assert "<0.1%" not in "".join(r.plain for r in rows)  # a rare token's probability, in digits
        probs = backend.pending_probs([first])
        assert probs is not None and 0.0 < probs[0][0] < 1.0  # raw probability of any token
        await pilot.press("enter")
        await stopped_at(pilot, 1)
        step = app.current.steps[0]
        assert (step.token_id, step.chosen_by) == (first, "hand")
        assert step.raw_prob == pytest.approx(probs[0][0], rel=1e-4)
        await pilot.press("ctrl+c")  # Ctrl+C while stopped ends the reply
        await wait_run(pilot)
        assert app.current.finish.reason == FinishReason.CANCELLED


async def test_f12_stops_a_running_reply_and_resumes_it(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path, max_tokens=12)  # (the gate holds it at 3: it cannot end before the stop)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        gate = StepGate(app, after=3)  # the engine held inside its 3rd step's hand-over
        await pilot.press(*PROMPT, "enter")
        await wait_for(pilot, lambda: gate.holding, 30, "the first steps")
        await pilot.press("f12")  # while it runs: it stops before its next draw
        gate.release()
        s = app.session
        await wait_for(pilot, lambda: s.stopped or not app.generating, 30, "the stop")
        assert s.stopped, "the reply ended before it could stop"
        n = len(app.current.steps)
        assert n == 3
        # (the session stops at the Pending; the step bar takes the focus when the app draws it)
        await wait_for(pilot, lambda: isinstance(app.focused, StepBar), 10, "the step bar's focus")
        assert s.pending.index == n and isinstance(app.focused, StepBar)
        await pilot.press("f12")
        await wait_run(pilot)
        assert not app.step_bar.display and isinstance(app.focused, PromptArea)
        assert len(app.current.steps) > n


async def test_f12_on_a_replay_says_why_not(tmp_path) -> None:
    app = create_app(
        replay=str(REPLY_TRACE), replay_speed=0, prefs=Prefs(), prefs_path=tmp_path / "p.json", history=False
    )
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f12")
        await pilot.pause()
        notes = [str(n.message) for n in app.notices]
        assert any("step mode needs" in n for n in notes), notes
        assert not app.step_bar.display
        await pilot.press("f12", "enter", "3", "slash")  # nothing to step: no crash
        await pilot.pause()
        assert app.is_running


async def test_f5_f9_while_stopped_say_so_and_ctrl_n_ends_the_reply_and_step_mode(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await armed_and_sent(pilot)
        for key in ("f5", "f9"):  # refused: the reply is stopped, not "still generating"
            app.clear_notifications()
            await pilot.press(key)
            await pilot.pause()
            notes = [str(n.message) for n in app.notices]
            assert any("stopped before a draw (step mode): Esc ends it" in n for n in notes), (key, notes)
        assert app.session.stopped and len(app.conversation.replies) == 1
        # a message sent from the box (focused by a click) says the same, and stays in the box
        app.prompt.focus()
        app.clear_notifications()
        await pilot.press(*"hi", "enter")
        await pilot.pause()
        notes = [str(n.message) for n in app.notices]
        assert any("stopped before a draw (step mode)" in n for n in notes), notes
        assert app.prompt.value == "hi" and len(app.conversation.replies) == 1
        app.step_bar.focus()
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: not backend.busy, 30, "the engine to let go")
        await wait_for(pilot, lambda: not app.step_bar.display, 5, "the die bar to go")
        # (the bar hides at once; Widget.focus() moves the focus by call_later, a moment after)
        await wait_for(pilot, lambda: isinstance(app.focused, PromptArea), 5, "the focus back in the message box")
        assert isinstance(app.focused, PromptArea) and app.session.pending is None
        await pilot.press("f12")  # arms again: the next reply stops too
        await pilot.press(*PROMPT, "enter")
        await stopped_at(pilot, 0)
        await pilot.press("escape")
        await wait_run(pilot)


def test_backends_without_step_mode_say_why() -> None:
    from tui_fixtures import FakeBackend

    from loopchat.backends.remote import RemoteBackend
    from loopchat.backends.replay import ReplayBackend
    from loopchat.chat.session import ChatSession, Refused

    assert not RemoteBackend.can_step and "server draws its own tokens" in RemoteBackend.step_refusal
    assert not ReplayBackend.can_step and "step mode needs" in ReplayBackend.step_refusal
    process = LiveBackend.__new__(LiveBackend)
    process.host = "process"  # the engine in a child process: no shared StepControl
    assert not process.can_step and "--host thread" in process.step_refusal
    session = ChatSession(FakeBackend())
    with pytest.raises(Refused, match="no step mode"):
        session.toggle_step()
    with pytest.raises(Refused, match="not stopped"):
        session.draw(1)


async def test_a_search_left_with_esc_keeps_the_die_and_ctrl_c_in_it_stops(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await armed_and_sent(pilot)
        await pilot.press("slash", *"zqxzqx")  # no such token: it says so, Enter picks nothing
        await wait_for(pilot, lambda: isinstance(app.screen, TokenSearch), 5, "the search")
        options = app.screen.query_one(OptionList)
        await wait_for(pilot, lambda: options.option_count == 1, 5, "the empty result")
        assert "no token starts with 'zqxzqx'" in str(options.get_option_at_index(0).prompt)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, TokenSearch) and app.current.steps == []
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, TokenSearch), 5, "the search to close")
        await pilot.press("slash", *"the", "escape")  # back to the die: nothing picked
        await wait_for(pilot, lambda: not isinstance(app.screen, TokenSearch), 5, "the search to close")
        assert app.session.stopped and app.current.steps == []
        await wait_for(pilot, lambda: isinstance(app.focused, StepBar), 5, "the focus back on the die bar")
        rec = app.current
        await pilot.press("slash", *"the", "ctrl+c")  # Ctrl+C in the search stops the reply
        await wait_run(pilot)
        await pilot.press("enter")  # the search's Enter after the reply ended: a notice, no pick
        await wait_for(pilot, lambda: not isinstance(app.screen, TokenSearch), 5, "the search to close")
        await wait_for(pilot, lambda: isinstance(app.focused, PromptArea), 5, "the focus back on the box")
        assert rec.steps == [] and rec.finish.reason == FinishReason.CANCELLED
        # stopped before its first token: the message is back in the box, its turn gone
        assert app.current is None and app.conversation.replies == [] and app.prompt.value == PROMPT


async def test_f2_while_stopped_reshapes_the_die_then_enter_draws_from_it(backend, tmp_path) -> None:
    from loopchat.tui.settings_dialog import SettingsDialog

    app = make_app(backend, tmp_path, temperature=0.8)
    async with app.run_test(size=SIZE) as pilot:
        await armed_and_sent(pilot)
        s = app.session
        before = s.pending
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsDialog), 5, "the dialog")
        note = str(app.screen.query_one("#settings-note").render())  # (it said "at the very next forward pass")
        assert "reshapes this draw's die" in note and "no new forward pass" in note
        await pilot.press(*"0.1", "enter")  # a cold die: the most likely token nearly certain
        await wait_for(
            pilot,
            lambda: (
                s.pending is not None
                and s.pending is not before
                and s.pending.settings.temperature == pytest.approx(0.1)
            ),
            10,
            "the reshaped die",
        )
        assert s.pending.sampled_top[0].prob > before.sampled_top[0].prob and app.current.steps == []
        await wait_for(pilot, lambda: isinstance(app.focused, StepBar), 5, "the focus back on the die bar")
        await pilot.press("enter")
        await stopped_at(pilot, 1)
        step = app.current.steps[0]
        assert step.settings.temperature == pytest.approx(0.1) and step.chosen_by == "step"
        await pilot.press("f12")
        await wait_run(pilot)


async def test_the_command_palette_arms_step_mode(backend, tmp_path) -> None:
    app = make_app(backend, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        commands = {c.title: c for c in app.get_system_commands(app.screen)}
        commands["Step mode"].callback()
        await pilot.pause()
        assert app.session.step_armed and app.step_bar.display


async def test_the_die_bar_and_the_panel_say_what_matters_on_a_narrow_screen(backend, tmp_path) -> None:
    from rich.cells import cell_len

    app = make_app(backend, tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await armed_and_sent(pilot)
        bar = app.step_bar
        said = str(bar.render())  # (it was cut at "· 1–9 pick · /": F12 and Esc lost)
        assert cell_len(said) <= bar.content_region.width, said
        assert all(k in said.lower() for k in ("before token 1", "enter", "n ×10", "1–9", "/ search", "f12")), said
        await pilot.press("enter")
        await stopped_at(pilot, 1)
        # the panel under the transcript has 9 lines: the die's rows and the settings the
        # keys change stay in them (the settings were cut, and 4 candidates of 10 shown)
        view = app.panel.view
        lines = panel_text(app).rstrip("\n").split("\n")
        assert view.height and len(lines) <= view.height, (view.height, lines)
        text = "\n".join(lines)
        first = app.current.steps[0]
        assert f"token 1 {show_token(first.piece)} drawn" in text  # what the Enter did
        assert f"{fmt_prob(first.raw_prob)} raw, {fmt_prob(first.sampled_prob)} after sampling" in text
        assert "Stopped before the draw of token 2" in text  # (its keys: in the die bar under it)
        assert "▸temperature 0.80" in text and "top_k" in text
        cand = app.session.pending.raw_top
        assert all(f"{i + 1}  {show_token(cand[i].text)}" in text for i in range(3)), text
        await pilot.press("escape")
        await wait_run(pilot)


async def test_step_mode_in_blocking_mode_says_the_loop_waits(backend, tmp_path) -> None:
    app = create_app(
        backend=backend,
        prefs=Prefs(markdown=False, streaming=False),
        prefs_path=tmp_path / "prefs.json",
        settings=SamplingSettings(seed=42, max_tokens=20),
        history=False,
    )
    async with app.run_test(size=SIZE) as pilot:
        await armed_and_sent(pilot)
        rec = app.current
        view = app.views[rec]
        for k in (1, 2):  # (it said "⠼ waiting for the whole reply (blocking mode) · 9.2 s")
            assert view.body_text().startswith("step mode: stopped before a draw (blocking mode"), view.body_text()
            await pilot.press("enter")
            await stopped_at(pilot, k)
        await pilot.press("f12")
        await wait_run(pilot)
        assert view.body_text() == rec.text and len(rec.steps) > 2
