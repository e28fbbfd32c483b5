"""The Pilot's idle poll (pilot_pace.py): in force for the session, and left alone where
Textual's names are gone."""

from __future__ import annotations

import importlib
import time

from pilot_pace import STEP_S, quicken
from textual.app import App, ComposeResult
from textual.widgets import Input


def test_the_session_polls_every_2_ms_as_conftest_set_it() -> None:
    wait = importlib.import_module("textual._wait")
    assert wait.SLEEP_GRANULARITY == STEP_S and wait.SLEEP_IDLE == STEP_S / 20.0


def test_where_textual_s_names_are_gone_nothing_is_changed_and_it_says_so() -> None:
    textual = importlib.import_module("textual")
    assert quicken("textual") == "textual has no SLEEP_GRANULARITY / SLEEP_IDLE: the Pilot keeps Textual's own pace"
    assert not hasattr(textual, "SLEEP_GRANULARITY")
    assert "is gone" in (quicken("textual._no_such_module") or "")


class _Typed(App[None]):
    def compose(self) -> ComposeResult:
        yield Input(id="box")


async def test_keys_typed_at_this_pace_arrive_whole_and_in_order() -> None:
    text = "the quick brown fox, 12 times!"
    app = _Typed()
    async with app.run_test() as pilot:
        t0 = time.perf_counter()
        await pilot.press(*text)
        typed_s = time.perf_counter() - t0
        assert app.query_one("#box", Input).value == text
    # reported, not asserted (a loaded machine may take longer): Textual's own pace spends
    # at least 2 x 20 ms of sleep a key
    print(f"{len(text)} keys in {typed_s * 1000:.0f} ms")
