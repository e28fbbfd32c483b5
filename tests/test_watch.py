"""Tokens on watch (issue 24, item 4; watch.py, engine/sampler_watch.py): each watched
token's raw and sampled probability and rank at every pass, even far outside the top-K;
against a full sort of recorded logits, and on the real default model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loopchat.engine.sampler import make_rng, sample
from loopchat.engine.sampler_watch import watched
from loopchat.event_json import event_from_json_dict, to_json_dict
from loopchat.events import Message, Start, Step
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings
from loopchat.watch import MAX_WATCH, WatchError, parse_watch, watch_line

ROWS = np.load(Path(__file__).parent / "data" / "run_logits.npz")["rows"]


def test_the_chat_s_line_is_shell_quoted_strings_at_most_eight() -> None:
    assert parse_watch('" Paris" " London" Berlin') == (" Paris", " London", "Berlin")
    assert parse_watch("") == ()
    for texts in ((" Paris", "it's", 'a "q"'), ("x",)):
        assert parse_watch(watch_line(texts)) == texts
    with pytest.raises(WatchError, match="at most 8"):
        parse_watch(" ".join("abcdefghi"))
    with pytest.raises(WatchError, match="quote"):
        parse_watch('" Paris')
    with pytest.raises(WatchError, match="cannot be empty"):
        parse_watch('""')
    assert MAX_WATCH == 8


def _reference(logits: np.ndarray, t: int, temperature: float, top_k: int) -> tuple[float, int, float, int]:
    """A full sort: the raw softmax in float64, and the distribution after top-k and
    temperature alone (no other stage acts in the settings used)."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    raw_rank = 1 + int(np.count_nonzero(logits > logits[t]))
    kept = np.argsort(-z, kind="stable")[:top_k] if top_k else np.arange(z.shape[0])
    if t not in set(kept.tolist()):
        return float(p[t]), raw_rank, 0.0, 0
    q = np.exp((z[kept] - z[kept].max()) / temperature)
    q /= q.sum()
    qt = q[kept.tolist().index(t)]
    return float(p[t]), raw_rank, float(qt), 1 + int(np.count_nonzero(q > qt))


@pytest.mark.parametrize("top_k", [40, 0])
def test_watched_figures_equal_a_full_sort_of_recorded_logits(top_k: int) -> None:
    s = SamplingSettings(temperature=0.8, top_k=top_k, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=3)
    for row in ROWS:
        order = np.argsort(-row, kind="stable")
        ids = [int(order[r]) for r in (0, 4, 39, 40, 900, 30000, row.shape[0] - 1)]
        res = sample(row, [], s, make_rng(3))
        got = watched(res, ids)
        assert [w.token_id for w in got] == ids
        for w in got:
            raw_p, raw_rank, samp_p, samp_rank = _reference(row, w.token_id, 0.8, top_k)
            assert w.raw_prob == pytest.approx(raw_p, rel=1e-5, abs=1e-12) and w.raw_rank == raw_rank
            assert w.sampled_prob == pytest.approx(samp_p, rel=1e-6, abs=1e-12) and w.sampled_rank == samp_rank
        # the drawn token, watched: the step's own figures, exactly
        (d,) = watched(res, [res.token_id])
        assert (d.raw_prob, d.raw_rank, d.sampled_prob, d.sampled_rank) == (
            res.raw_prob,
            res.raw_rank,
            res.sampled_prob,
            res.sampled_rank,
        )


@pytest.mark.model
def test_a_reply_records_its_watched_tokens_at_every_step(engine) -> None:
    request = ReplyRequest(
        (Message("user", "Name a city in France."),),
        SamplingSettings(seed=11, max_tokens=12, temperature=0.9),
        watch=(" Paris", " London", ".", "zebra"),
    )
    events = list(engine.run_reply(request))
    start = next(e for e in events if isinstance(e, Start))
    steps = [e for e in events if isinstance(e, Step)]
    texts = [t for t, _ in start.watch]
    assert texts == list(request.watch)
    ids = [i for _, i in start.watch]
    assert ids[0] == engine.llm.tokenize(b" Paris", add_bos=False, special=False)[0]
    for step in steps:
        assert [w.token_id for w in step.watched] == ids
        for w in step.watched:
            assert 0 < w.raw_prob <= 1 and w.raw_rank >= 1
            assert (w.sampled_prob == 0) == (w.sampled_rank == 0)
            if w.token_id == step.token_id:
                assert (w.raw_prob, w.raw_rank, w.sampled_prob, w.sampled_rank) == (
                    step.raw_prob,
                    step.raw_rank,
                    step.sampled_prob,
                    step.sampled_rank,
                )
            top = {c.token_id: (i + 1, c.prob) for i, c in enumerate(step.raw_top)}
            if w.token_id in top:
                assert w.raw_prob == top[w.token_id][1]
    # the trace keeps them; a reply that watches nothing has none (and its trace no key)
    assert event_from_json_dict(to_json_dict(steps[0])) == steps[0]
    assert event_from_json_dict(to_json_dict(start)) == start
    plain = [e for e in engine.run_reply(request.with_(watch=())) if isinstance(e, Step)]
    assert plain[0].watched is None and "watched" not in to_json_dict(plain[0])


@pytest.mark.model
async def test_the_palette_sets_tokens_on_watch_and_the_panel_shows_them(live_backend, tmp_path) -> None:
    from textual.widgets import Input, Static
    from tui_fixtures import model_app, palette_pick, panel_text, wait_for, wait_run

    from loopchat.chat.plots import fmt_prob
    from loopchat.tui.watch_screen import WatchScreen

    app = model_app(live_backend, tmp_path, seed=4, max_tokens=5, temperature=0.7)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model")
        await palette_pick(pilot, "Tokens on watch")
        await wait_for(pilot, lambda: isinstance(app.screen, WatchScreen), 5, "the watch dialog")
        box = app.screen.query_one("#watch-line", Input)
        box.value = '" Paris'  # an unclosed quote: one line that says what to do; the dialog stays
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, WatchScreen)
        assert "quote each" in str(app.screen.query_one("#watch-error", Static).render())
        box.value = '" Paris" " London" the'
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, WatchScreen), 5, "the dialog closed")
        assert app.session.watch == (" Paris", " London", "the")
        await pilot.press(*"The capital of France is", "enter")
        await wait_run(pilot)
        rec = app.conversation.replies[-1]
        assert [t for t, _ in rec.start.watch] == [" Paris", " London", "the"]
        last = rec.steps[-1]
        text = panel_text(app)
        assert "Watching" in text
        for (name, _), w in zip(rec.start.watch, last.watched):
            assert f"{fmt_prob(w.raw_prob)} #{w.raw_rank} → " in text, (name, text)
        # Esc leaves them; an empty line clears them
        await palette_pick(pilot, "Tokens on watch")
        await wait_for(pilot, lambda: isinstance(app.screen, WatchScreen), 5, "the watch dialog")
        assert app.screen.query_one("#watch-line", Input).value == '" Paris" " London" the'
        await pilot.press("escape")
        await pilot.pause()
        assert app.session.watch == (" Paris", " London", "the")
        await palette_pick(pilot, "Tokens on watch")
        await wait_for(pilot, lambda: isinstance(app.screen, WatchScreen), 5, "the watch dialog")
        app.screen.query_one("#watch-line", Input).value = ""
        await pilot.press("enter")
        await pilot.pause()
        assert app.session.watch == ()
        # F2 has a row for them too: a bad line is its own hint's error, a good one applies
        from loopchat.tui.settings_dialog import SettingsDialog

        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsDialog), 5, "the settings dialog")
        row = app.screen.query_one("#set-watch", Input)
        row.value = " ".join("abcdefghi")
        await pilot.pause()
        app.screen.action_apply()
        await pilot.pause()
        assert isinstance(app.screen, SettingsDialog)
        assert "at most 8" in str(app.screen.query_one("#err-watch", Static).render())
        row.value = '" Rome"'
        await pilot.pause()
        app.screen.action_apply()
        await wait_for(pilot, lambda: app.session.watch == (" Rome",), 5, "the dialog's watch applied")
        assert not isinstance(app.screen, SettingsDialog)
