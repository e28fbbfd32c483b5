"""The chat's N replies in one batch (Shift+F5) on the real default model: they land as versions
of the reply (Alt+PgUp / Alt+PgDn), the panel gives a batched pass's cost against one sequence's,
and Alt+V shows the versions side by side, pass by pass, with where they part."""

from __future__ import annotations

import pytest
from rich.console import Console
from tui_fixtures import model_app, panel_text, record_notices, reply_to, wait_for, wait_run

from loopchat.batch import CHAT_N
from loopchat.tui.versions_screen import VersionsScreen, versions_renderable

pytestmark = pytest.mark.model

SIZE = (120, 40)


@pytest.fixture(scope="module")
def backend(live_backend):
    return live_backend  # the session's (conftest.py): loaded once for every chat module


def _text(renderable) -> str:
    console = Console(width=200, record=True, color_system=None, file=open("/dev/null", "w"))
    console.print(renderable)
    return console.export_text()


async def test_shift_f5_writes_n_versions_and_alt_v_shows_where_they_part(backend, tmp_path) -> None:
    app = model_app(backend, tmp_path, seed=7, max_tokens=12, temperature=1.2)
    async with app.run_test(size=SIZE) as pilot:
        said = record_notices(app)
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await pilot.press("alt+v")  # nothing to show yet: said, not an error
        await reply_to(pilot, "Name a bird.")
        await pilot.press("alt+v")
        assert any("one version" in s for s in said)
        (first,) = app.conversation.replies
        await pilot.press("shift+f5")
        await wait_run(pilot, 120)
        await wait_for(pilot, lambda: not app.session.generating, 60, "the batch's end")
        assert any(f"Writing {CHAT_N} replies in one batch" in s for s in said)
        versions = [r for r in first.siblings if r is not first]
        assert len(versions) == CHAT_N and all(r.finish is not None for r in versions)
        assert [r.finish.sequence for r in versions] == list(range(CHAT_N))
        assert [r.start.settings.seed for r in versions] == [8 + j for j in range(CHAT_N)]  # 7 moved on, + j
        shown = app.conversation.last_in_history()
        assert shown is versions[0] and all(r.hidden for r in versions[1:])
        assert len({r.text for r in versions}) > 1, "four draws at temperature 1.2 gave one text"
        # the panel: the batched pass behind the last step, against one sequence's
        assert "batch       4 tokens in" in panel_text(app) and "one sequence:" in panel_text(app)
        # Alt+PgDn: the next version is shown, and the conversation goes on from it
        await pilot.press("alt+pagedown")
        await pilot.pause()
        assert app.conversation.last_in_history() is versions[1]
        # Alt+V: side by side, from a few passes before they part
        await pilot.press("alt+v")
        await wait_for(pilot, lambda: isinstance(app.screen, VersionsScreen), 10, "the versions view")
        view = app.screen.view
        steps = [{s.index: s.token_id for s in r.steps} for r in first.siblings if r.steps]
        parted = next(i for i in range(99) if len({d.get(i) for d in steps}) > 1)
        assert view.parted_at == parted and f"they part at pass {parted + 1}" in view.title
        drawn = first.siblings[1].steps[parted]
        assert view.parting[1].startswith(f"v2 drew {drawn.piece!r}: p {drawn.sampled_prob:.4f} as drawn")
        text = _text(versions_renderable(view))
        assert f"▶ {parted + 1}" in text and "one sequence:" in text
        # the default model's flash attention is off: the view says what that does to a batched row
        assert first.start.flash_attn == "off"
        assert (
            "flash attention off: a batched pass's probabilities can differ from one sequence's by a few hundredths"
            in text
        )
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, VersionsScreen)
