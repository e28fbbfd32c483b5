"""Every key the README and docs/keys.md list, pressed in the app, with its effect checked
(no model: FakeBackend emits a fixed reply). docs/keys.md's key table and F1's list must
agree, and the README's short table names only keys of that list."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from textual import events
from tui_fixtures import FakeBackend, palette_pick, panel_text, reply_to, wait_for, wait_run

from loopchat.chat.conversation import BLOCKING, STREAM
from loopchat.chat.prefs import Prefs, load_prefs
from loopchat.events import FinishReason
from loopchat.settings import SamplingSettings
from loopchat.tui.app import LoopChatApp
from loopchat.tui.help_screen import KEYS, HelpScreen
from loopchat.tui.settings_dialog import SettingsDialog

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
KEYS_DOC = ROOT / "docs" / "keys.md"
REPLY = "Hello, world! How are you?"


def make_app(tmp_path, backend=None, **prefs) -> LoopChatApp:
    prefs.setdefault("markdown", False)
    return LoopChatApp(backend or FakeBackend(), prefs=Prefs(**prefs), prefs_path=tmp_path / "p.json")


def _table_after(text: str, heading: str) -> list[tuple[str, str]]:
    """The rows (key, what it does) of the first Markdown table after `heading`."""
    lines = text.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Key |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        key, what = line.split("|")[1:3]
        rows.append((key.strip(), what.strip()))
    return rows


def test_the_key_doc_table_is_f1s_list() -> None:
    assert _table_after(KEYS_DOC.read_text(encoding="utf-8"), "## Keys") == list(KEYS)


def test_the_readme_names_only_keys_of_f1s_list() -> None:
    """The README's short table (a newcomer's first keys) is worded for a newcomer, but each
    of its keys is one of F1's: a key dropped from the app cannot linger there."""
    rows = _table_after(README.read_text(encoding="utf-8"), "## The chat")
    assert len(rows) >= 10
    f1_keys = [key for key, _ in KEYS]
    for key, _ in rows:
        assert any(k == key or k.startswith(key + " ") for k in f1_keys), key


async def test_enter_sends_and_ctrl_j_alt_enter_break_the_line(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("a", "ctrl+j", "b", "alt+enter", "c")
        assert app.prompt.value == "a\nb\nc"
        assert not app.conversation.replies  # no key so far sent it
        # keys that arrive in one read from the terminal (typed fast, or a script): the
        # line break lands where it was typed, not after the keys that followed it
        for key, char in [("x", "x"), ("ctrl+j", "\n"), ("y", "y"), ("z", "z")]:
            app.post_message(events.Key(key, char))
        await wait_for(pilot, lambda: app.prompt.value.endswith("z"), 5, "the keys")
        assert app.prompt.value == "a\nb\ncx\nyz"
        # the same for the editing keys: "hello", 5 Backspaces, "ok", Left, "!" in one read
        # (Backspace landed after the letters that followed it: "helloo")
        keys = (
            [(c, c) for c in " hello"]
            + [("backspace", None)] * 5
            + [("o", "o"), ("k", "k"), ("left", None), ("!", "!")]
        )
        for key, char in keys:
            app.post_message(events.Key(key, char))
        await wait_for(pilot, lambda: app.prompt.value.endswith("k"), 5, "the keys")
        assert app.prompt.value == "a\nb\ncx\nyz o!k"
        await pilot.press("end", "backspace", "backspace", "backspace", "backspace")
        assert app.prompt.value == "a\nb\ncx\nyz"
        await pilot.press("enter")
        await wait_run(pilot)
        assert app.conversation.replies[0].messages[-1].content == "a\nb\ncx\nyz"
        assert app.prompt.value == ""


async def test_a_multi_line_paste_arrives_whole(tmp_path) -> None:
    pasted = "def f(x):\n    return x * 2\n\nExplain this code."
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        # what the terminal driver posts for a bracketed paste
        app.post_message(events.Paste(pasted))
        # the box grows with the text in the layout after it (a loaded machine reads the text first)
        await wait_for(
            pilot, lambda: app.prompt.value == pasted and app.prompt.size.height == 4, 5, "the paste, 4 rows"
        )
        assert app.prompt.size.height == 4  # the box grew with the text
        await pilot.press("enter")
        await wait_run(pilot)
        assert app.conversation.replies[0].messages[-1].content == pasted
        assert app.conversation.turns[0].content == pasted
        user = app.transcript.blocks[0]
        shown = [user.line(i).text for i in range(user.height)]
        assert "│ def f(x):" in [s.rstrip() for s in shown]
        assert "│     return x * 2" in [s.rstrip() for s in shown]  # indentation kept


async def test_the_box_grows_to_six_lines_then_scrolls(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        app.post_message(events.Paste("\n".join(f"line {i}" for i in range(20))))
        await wait_for(
            pilot, lambda: app.prompt.value.count("\n") == 19 and app.prompt.size.height == 6, 5, "the paste, 6 rows"
        )
        assert app.prompt.size.height == 6  # 6 lines of text (8 rows with the border)
        assert app.prompt.outer_size.height == 8
        assert app.prompt.max_scroll_y > 0


async def test_escape_stops_a_reply(tmp_path) -> None:
    app = make_app(tmp_path, FakeBackend(tokens=[f" t{i}" for i in range(2000)], delay=0.005))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"go", "enter")
        await wait_for(pilot, lambda: app.steps_seen >= 5, 10, "tokens")
        await pilot.press("escape")
        await wait_run(pilot, 10)
        assert app.conversation.replies[0].finish.reason == FinishReason.CANCELLED


async def test_alt_up_down_change_the_selected_setting(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        t0 = app.session.in_force().temperature
        await pilot.press("alt+up", "alt+up")
        assert app.session.in_force().temperature == round(t0 + 0.2, 2)
        await pilot.press("alt+down")
        assert app.session.in_force().temperature == round(t0 + 0.1, 2)


async def test_top_k_knob_reaches_the_settings_limit(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        app.set_setting(top_k=1_000_000 - 2)
        await pilot.press("f8", "f8")  # top_p, then top_k
        assert app.knob == "top_k"
        await pilot.press("ctrl+up")
        assert app.session.in_force().top_k == 1_000_000


async def test_settings_changed_between_replies_show_in_the_panel(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "hello")
        await pilot.press("ctrl+up")
        await pilot.pause()
        text = panel_text(app)
        assert "(next reply)" in text
        assert re.search(r"temperature\s+0\.80\s+reply 1 had 0\.70", text), text
        # the dialog's changes show too
        await pilot.press("f2")
        await pilot.pause()
        app.screen.query_one("#set-min_p").value = "0.2"
        await pilot.press("enter")
        await pilot.pause()
        assert re.search(r"min_p\s+0\.20\s+reply 1 had 0\.05", panel_text(app))
        # a selected token shows the settings in force at its pass
        await pilot.press("alt+left")
        assert "(at this pass)" in panel_text(app)


@pytest.mark.slow
async def test_f2_enter_applies_the_dialog_and_keeps_the_draft(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"my draft")
        await pilot.press("f2")
        await pilot.pause()
        assert isinstance(app.screen, SettingsDialog)
        temp = app.screen.query_one("#set-temperature")
        assert app.focused is temp
        await pilot.press(*"0.3", "enter")  # the field's text is selected on focus
        await pilot.pause()
        assert not isinstance(app.screen, SettingsDialog)
        assert app.session.in_force().temperature == 0.3
        assert app.prompt.value == "my draft"
        assert app.conversation.replies == [] and not app.transcript.blocks
        # an invalid value: Enter keeps the dialog open and sends nothing either
        await pilot.press("f2")
        await pilot.pause()
        await pilot.press(*"9", "enter")
        await pilot.pause()
        assert isinstance(app.screen, SettingsDialog)
        assert app.conversation.replies == [] and app.session.in_force().temperature == 0.3
        await pilot.press("escape")
        await pilot.pause()
        assert app.prompt.value == "my draft"


async def test_f2_seed_empty_is_random_and_a_number_pins_it(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        assert app.session.in_force().seed is None
        await pilot.press("f2")
        await pilot.pause()
        seed = app.screen.query_one("#set-seed")
        assert seed.value == ""
        seed.value = "123"
        await pilot.pause()
        app.screen.action_apply()
        await pilot.pause()
        assert app.session.in_force().seed == 123
        assert "seed 123" in panel_text(app)


async def test_f3_switches_streaming_and_blocking(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f3")
        assert load_prefs(tmp_path / "p.json").streaming is False
        assert "blocking" in app.sub_title
        await reply_to(pilot, "hi")
        assert app.conversation.replies[0].mode == BLOCKING
        await pilot.press("f3")
        await reply_to(pilot, "again")
        assert app.conversation.replies[1].mode == STREAM


async def test_f5_regenerates_the_last_reply(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "Say hi.")
        await pilot.press("f5")
        await wait_for(pilot, lambda: len(app.conversation.replies) == 2, 5, "the second reply")
        await wait_run(pilot)
        first, second = app.conversation.replies
        assert app.is_running
        assert first.replaced_by == 2 and not first.in_history
        assert second.in_history and second.messages == first.messages
        assert [m.content for m in app.conversation.turns] == ["Say hi.", REPLY]
        # the new version is shown in the old one's place: one reply view, "version 2/2"
        (view,) = app.transcript.reply_views()
        assert view.record is second and "version 2/2" in view.line(1).text
        assert first.siblings is second.siblings and first.hidden and not second.hidden
        assert app.session.in_force().seed is None  # a random seed stays random
        # a pinned seed moves to the next one, so the new reply can differ
        app.set_setting(seed=7)
        await pilot.press("f5")
        await wait_for(pilot, lambda: len(app.conversation.replies) == 3, 5, "the third reply")
        await wait_run(pilot)
        assert app.session.in_force().seed == 8
        assert len(app.conversation.turns) == 2
        (view,) = app.transcript.reply_views()
        assert "version 3/3" in view.line(1).text


async def test_f9_replays_in_the_other_mode_with_the_replys_settings(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        app.set_setting(seed=5, temperature=0.6)
        await reply_to(pilot, "hello")
        app.set_setting(temperature=1.5)  # the user's settings for the next replies
        await pilot.press("f9")
        await wait_for(pilot, lambda: len(app.conversation.replies) == 2, 5, "the replay")
        await wait_run(pilot)
        first, replay = app.conversation.replies
        assert replay.mode == BLOCKING and replay.replay_of == 1 and not replay.in_history
        assert replay.start.settings == first.start.settings  # what the reply used
        assert replay.text == first.text
        assert app.session.in_force().temperature == 1.5  # the user's own settings are kept
        assert len(app.conversation.turns) == 2


async def test_ctrl_n_starts_a_new_conversation(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "hello")
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.conversation.replies == [] and app.conversation.turns == []
        assert not app.transcript.blocks


async def test_ctrl_y_copies_the_last_reply(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "hello")
        await pilot.press("ctrl+y")
        assert app.clipboard == REPLY


async def test_f4_f6_f7_toggle_and_are_remembered(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "hello")
        legend = app.query_one("#legend")
        await pilot.press("f4")
        assert load_prefs(tmp_path / "p.json").markdown is True
        await pilot.press("f6")
        assert load_prefs(tmp_path / "p.json").token_boundaries is True
        shown = legend.display
        await pilot.press("f7")
        assert load_prefs(tmp_path / "p.json").prob_colours is (not Prefs().prob_colours)
        assert legend.display is not shown


@pytest.mark.slow
async def test_ctrl_p_opens_the_command_palette(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await palette_pick(pilot, "Stream/blocking")
        await pilot.pause()
        assert app.prefs.streaming is False


async def test_f1_shows_the_apps_own_keys_and_closes_again(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        keys = app.screen.query_one("#help-keys")
        shown = "\n".join(strip.text for strip in keys.render_lines(keys.size.region))
        for key, what in KEYS:
            assert key in shown and what.split(" (")[0][:30] in shown
        await pilot.press("f1")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("f1", "escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


async def test_ctrl_q_quits(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+q")
        await pilot.pause()
    assert app.return_value == 0
    assert not app.is_running


async def test_resizing_across_the_narrow_boundary_both_ways(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "hello")
        assert not app.screen.has_class("-narrow")
        # (the panel's view follows its size at its next frame, which one pause need not reach)
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: app.panel.view.compact, 5, "the compact panel")
        assert app.screen.has_class("-narrow") and app.panel.view.compact
        assert app.panel.outer_size.width == 80  # the panel goes under the transcript
        assert app.transcript.outer_size.width == 80
        await pilot.resize_terminal(120, 40)
        await wait_for(pilot, lambda: not app.panel.view.compact, 5, "the wide panel")
        assert not app.screen.has_class("-narrow") and not app.panel.view.compact
        assert app.panel.outer_size.width == 52


async def test_seed_shown_in_the_panel_is_the_replys(tmp_path) -> None:
    app = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        app.set_setting(seed=99)
        await reply_to(pilot, "hello")
        await pilot.press("alt+left")
        assert "seed 99" in panel_text(app)
        assert app.conversation.replies[0].start.settings == SamplingSettings(seed=99)


async def test_f2_lists_the_settings_in_the_panels_order_and_shows_whole_errors(tmp_path) -> None:
    from loopchat.settings import SETTINGS

    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f2")
        await pilot.pause()
        dialog = app.screen
        ids = [w.id.removeprefix("set-") for w in dialog.query(".setting-input")]
        assert ids == [s.name for s in SETTINGS]
        assert ids[:4] == ["temperature", "top_p", "top_k", "min_p"]  # the panel's knobs first
        dialog.query_one("#set-repeat_last_n").value = "123456789"
        await pilot.pause()
        err = dialog.query_one("#err-repeat_last_n")
        shown = " ".join(strip.text.strip() for strip in err.render_lines(err.size.region))
        assert "…" not in shown and "100000" in shown and "123456789" in shown
