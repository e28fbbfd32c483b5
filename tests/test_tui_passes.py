"""The chat shows a reply made under a draft (issue 25, "Shown"), through Textual's Pilot:
a trace of the recorded real reply with its steps grouped into verifying passes
(spec_reply.py) is replayed in the chat; a token clicked shows its pass row in the panel,
F6's third state groups the tokens by the pass that gave them (a drafted token the pass
kept on green), and the reply's info line gives tokens per pass and the acceptance rate.
"""

from __future__ import annotations

import pytest
from spec_reply import write_speculative_trace
from tui_fixtures import panel_text, wait_for, wait_run

from loopchat.chat.pass_stats import reply_part, same_pass
from loopchat.chat.prefs import Prefs, load_prefs
from loopchat.tui.launch import create_app
from loopchat.tui.token_styles import BOUNDARY_BG, KEPT_BG

pytestmark = pytest.mark.slow  # a replayed reply through the whole app: a few seconds on a busy machine


def _backgrounds(view) -> dict[int, str | None]:
    """The background of each of the reply's tokens as drawn (by the step its meta names)."""
    out: dict[int, str | None] = {}
    for i in range(view.height):
        for seg in view.line(i):
            token = seg.style.meta.get("token") if seg.style is not None else None
            if token is not None:
                bg = seg.style.bgcolor
                out.setdefault(token[1], bg.name if bg is not None else None)
    return out


async def test_the_chat_shows_the_passes_of_a_reply_under_a_draft(tmp_path) -> None:
    trace = write_speculative_trace(tmp_path / "spec.jsonl")
    app = create_app(replay=str(trace), replay_speed=0, prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_run(pilot, 30)
        rec = app.conversation.replies[0]
        steps = rec.steps
        view = app.transcript.reply_views()[0]
        # the info line: tokens per pass and the acceptance rate, as pass_stats computes them
        phrase = reply_part(steps)
        assert phrase is not None and phrase in view.info_text().plain
        # F6: by token, then by pass (remembered), then off
        await pilot.press("f6")
        assert load_prefs(tmp_path / "p.json").token_boundaries is True
        by_token = _backgrounds(view)
        await pilot.press("f6")
        prefs = load_prefs(tmp_path / "p.json")
        assert prefs.token_passes is True and prefs.token_boundaries is False
        await pilot.pause()
        by_pass = _backgrounds(view)
        assert by_pass != by_token
        # the shown tokens, pass by pass: one shade per pass, the next pass the other one;
        # the drafts a pass kept on its green, its own token on its grey-blue
        groups: list[list] = []
        for s in (s for s in steps if s.text and not s.is_stop):  # (a newline token has no cell of its own)
            if groups and same_pass(groups[-1][-1], s):
                groups[-1].append(s)
            else:
                groups.append([s])
        shades = []
        for group in groups:
            shade = {
                (KEPT_BG if s.drafted else BOUNDARY_BG).index(by_pass[s.index]) for s in group if s.index in by_pass
            }
            assert len(shade) <= 1, [s.index for s in group]
            shades.append(shade.pop() if shade else None)
        assert all(a != b for a, b in zip(shades, shades[1:]) if a is not None and b is not None)
        first = next(g for g in groups if g[0].pass_report is not None)  # pass 1: steps 1-4
        assert [s.index for s in first] == [1, 2, 3, 4] and {by_pass[i] for i in (1, 2, 3)} <= set(KEPT_BG)
        await pilot.press("f6")
        await pilot.pause()
        assert set(_backgrounds(view).values()) == {None}
        assert not load_prefs(tmp_path / "p.json").token_passes
        # a click on the token step 4 drew (the pass's own, after it refused a draft)
        t = app.transcript
        start = t._starts[t.blocks.index(view)]
        row = next(i for i in range(view.height) if " associated" in view.line(i).text)
        x = view.line(row).text.index(" associated") + 2  # +1: the transcript's left padding
        await pilot.click(t, offset=(x, start + row - int(t.scroll_y)))
        await wait_for(pilot, lambda: app.selection == (1, 4), 10, "the token selected")
        shown = " ".join(panel_text(app).split())  # (the panel's rows wrap at its width)
        assert "Forward pass 2 · token 5 · selected token of reply 1" in shown
        assert "pass 2 · checked 5 drafted tokens · kept 3 + 1 drawn · 14.2 ms" in shown
        assert "this token: drawn by the pass after the draft's" in shown
