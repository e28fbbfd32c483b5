"""The document view colours the prompt by surprisal (issue 26, part 2): the chat scores
the prompt of a reply sent while the view is open; each prompt token's background is its
surprisal's, its text's colour its role's (system, user, template), the cursor line gives
its surprisal and the model's top guess, the header the perplexity and the most
surprising token. The chat through Textual's Pilot on the real default model."""

from __future__ import annotations

import math

import pytest
from tui_fixtures import document_settled, wait_for, wait_run

from loopchat.chat.prefs import Prefs
from loopchat.chat.views.document_surprisal import surprisal_bg
from loopchat.prompt_read import SYSTEM, TEMPLATE, USER, summary, surprisals, token_kinds
from loopchat.settings import SamplingSettings
from loopchat.tui.launch import create_app

pytestmark = pytest.mark.model
SIZE = (120, 40)


@pytest.fixture(scope="module")
def backend(live_backend):
    return live_backend  # the session's (conftest.py): loaded once for every chat module


def plain(lines) -> str:
    return "\n".join("".join(s for s, _ in line) for line in lines)


async def test_a_reply_sent_with_the_document_open_has_its_prompt_coloured_by_surprisal(backend, tmp_path) -> None:
    app = create_app(
        backend=backend,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "p.json",
        settings=SamplingSettings(seed=3, max_tokens=6),
        history=False,
    )
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        await pilot.press(*"What is the capital of Germany?", "enter")
        await wait_run(pilot)
        await pilot.pause()
        rec = app.conversation.replies[0]
        doc = app.document
        assert doc.record is rec and rec.prefill.prompt_logprobs is not None
        bits = surprisals(rec.prefill)
        s = summary(bits)
        head = plain(doc.head.lines)
        assert f"prompt perplexity {s.perplexity:,.2f} over {len(bits) - 1} tokens" in head
        texts = rec.start.prompt_token_texts
        assert f"most surprising {texts[s.worst]!r} at {s.worst} ({s.worst_bits:.2f} bits)" in head
        kinds = token_kinds(rec.start)
        assert {SYSTEM, USER, TEMPLATE} <= set(kinds)
        user_words = "".join(t for t, k in zip(texts, kinds) if k == USER)
        assert user_words == "What is the capital of Germany?"
        tokens = doc.doc.tokens
        for i, t in enumerate(tokens[: len(texts)]):
            styles = {style for row in doc.doc.rows[t.first_row : t.last_row + 1] for _, style, k in row if k == i}
            assert {st.bgcolor.name for st in styles} == {surprisal_bg(bits[i], i)}, (i, t)
            assert t.role == kinds[i]
        # the three roles' texts in three colours (a control token keeps its own)
        role_colours = {
            k: {st.color for i, t in enumerate(tokens[: len(texts)]) if t.role == k and t.kind != "control"
                for row in doc.doc.rows[t.first_row : t.last_row + 1] for _, st, j in row if j == i}
            for k in (SYSTEM, USER, TEMPLATE)
        }  # fmt: skip
        assert all(len(c) == 1 for c in role_colours.values()) and len(set().union(*role_colours.values())) == 3
        # the cursor on the user's ' Germany': its surprisal and the model's guess there
        g = next(i for i, (t, k) in enumerate(zip(texts, kinds)) if k == USER and t == " Germany")
        doc.body.focus()
        await pilot.press("home")
        for _ in range(g):
            await pilot.press("right")
        await pilot.pause()
        line = plain(doc.status.lines)
        guess = rec.prefill.prompt_top[g][0]
        assert f"position {g}" in line and "(user)" in line
        assert f"{-rec.prefill.prompt_logprobs[g] / math.log(2):.2f} bits" in line
        assert f"the model's guess {guess.text!r} {guess.prob:.3f}" in line
        # closed, the next reply's prompt is not scored
        await pilot.press("ctrl+t")
        await document_settled(pilot)
        await pilot.press(*"Thanks", "enter")
        await wait_run(pilot)
        assert app.conversation.replies[1].prefill.prompt_logprobs is None
