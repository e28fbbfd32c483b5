"""Compare two replies (Ctrl+G): the figures (reply_stats.py) against the records of the
real default model, and the screen (compare_view.py) pressed through in the app.

The recorded conversation (tests/data/compare.jsonl, docs/compare-walkthrough.md) is the
default model's two replies to "What is 482 * 194?" asked directly and "step by step".
Re-record it: python tests/tui_fixtures.py record-compare (then update the snapshot).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from tui_fixtures import COMPARE_QUESTIONS, COMPARE_TRACE, fake_app, palette_pick, reply_to, wait_for

from loopchat.chat.conversation import STREAM, ReplyRecord
from loopchat.chat.plots import fmt_ms, sparklines_same_scale
from loopchat.chat.prefs import Prefs
from loopchat.chat.reply_stats import comparable, reply_stats
from loopchat.events import Finish, Message, Prefill, Start, Step
from loopchat.settings import SamplingSettings
from loopchat.trace import read_trace
from loopchat.tui.compare_view import NOT_GIVEN, CompareScreen, compare_rows, spark_rows
from loopchat.tui.launch import create_app


def _records(events) -> list[ReplyRecord]:
    """The replies of a run of events, as the app holds them."""
    out: list[ReplyRecord] = []
    for e in events:
        if isinstance(e, Start):
            out.append(ReplyRecord(number=len(out) + 1, mode=STREAM, messages=e.messages, start=e))
        elif isinstance(e, Prefill):
            out[-1].prefill = e
        elif isinstance(e, Step):
            out[-1].steps.append(e)
        elif isinstance(e, Finish):
            out[-1].finish = e
    return out


def _trace_records() -> list[ReplyRecord]:
    _, traced = read_trace(COMPARE_TRACE)
    return _records(t.event for t in traced)


def test_figures_of_the_recorded_replies_are_computed_from_their_steps() -> None:
    recs = _trace_records()
    assert [r.messages[-1].content for r in recs] == list(COMPARE_QUESTIONS)
    for rec in recs:
        s = reply_stats(rec)
        steps, prefill, finish = rec.steps, rec.prefill, rec.finish
        assert s.question == rec.messages[-1].content
        assert s.passes == prefill.batches + len(steps) - 1 == prefill.batches + finish.steps - 1
        assert (s.prompt_tokens, s.evaluated_tokens, s.reused_tokens) == (
            prefill.prompt_tokens,
            prefill.evaluated_tokens,
            prefill.reused_tokens,
        )
        assert s.prefill_ms == prefill.ms == finish.prefill_ms
        assert s.decode_ms == finish.decode_ms and s.ttft_ms == finish.ttft_ms
        assert s.tokens == finish.completion_tokens == sum(1 for st in steps if not st.is_stop)
        assert s.steps == len(steps)
        assert s.mean_entropy == sum(st.raw_entropy for st in steps) / len(steps)
        assert s.mean_surprisal == sum(-math.log2(st.raw_prob) for st in steps) / len(steps)
        assert s.pass_ms == tuple(st.forward_ms for st in steps[1:])
        assert s.decode_pass_ms == sum(s.pass_ms) / len(s.pass_ms)
        assert s.entropies == tuple(st.raw_entropy for st in steps)
        assert s.text == finish.text == "".join(st.text for st in steps)
        assert s.finish == "stop"
    # the second question saw the first exchange: its prompt reused the cache of it
    assert recs[1].prefill.reused_tokens > 0


@pytest.mark.model
def test_passes_are_the_engines_own_count(engine) -> None:
    """Forward passes as the engine counts its llama_decode calls, for a first reply and
    for a second one in the same conversation (its prefill reusing the KV cache)."""
    settings = SamplingSettings(temperature=0.0, seed=1, max_tokens=6)
    messages = [Message("user", "What is 482 * 194?")]
    engine.reset()
    for _ in (1, 2):
        before = engine.passes
        (rec,) = _records(engine.generate(messages, settings, report_k=3))
        s = reply_stats(rec)
        assert s.passes == engine.passes - before
        assert s.tokens == 6 and s.finish == "length"
        messages += [Message("assistant", rec.finish.text), Message("user", "And step by step?")]
    assert rec.prefill.reused_tokens > 0


def test_a_stored_conversation_gives_the_same_figures(tmp_path) -> None:
    """Ctrl+O's replies (restored from the history store) compare as the live ones do."""
    from history_helpers import store_reply

    from loopchat.chat.stored_replies import restore
    from loopchat.history.store import ConversationStore

    _, traced = read_trace(COMPARE_TRACE)
    events = [t.event for t in traced]
    cut = [i for i, e in enumerate(events) if isinstance(e, Start)][1]
    recs = _trace_records()
    with ConversationStore.open(tmp_path / "h.sqlite3") as store:
        conv = store.new_conversation("482", "SmolLM2", system_prompt=recs[0].messages[0].content)
        parent = None
        for rec, part in zip(recs, (events[:cut], events[cut:])):
            user = store.add_message(conv, parent, "user", rec.messages[-1].content)
            parent = store_reply(store, conv, user, part)
        restored = restore(store.load(conv)).conversation.replies
    assert [reply_stats(r) for r in restored] == [reply_stats(r) for r in recs]


def test_rows_show_the_figures_and_ratios() -> None:
    a, b = (reply_stats(r) for r in _trace_records())
    rows = {r[0]: r[1:] for r in compare_rows(a, b)}
    assert rows["question"][:2] == COMPARE_QUESTIONS
    assert rows["forward passes"] == (str(a.passes), str(b.passes), f"×{b.passes / a.passes:.2f}")
    assert rows["tokens"] == (str(a.tokens), str(b.tokens), f"×{b.tokens / a.tokens:.2f}")
    assert rows["prefill"][:2] == (fmt_ms(a.prefill_ms), fmt_ms(b.prefill_ms))
    assert rows["mean entropy"][:2] == (f"{a.mean_entropy:.2f} bits", f"{b.mean_entropy:.2f} bits")
    assert rows["prompt tokens"][1] == f"{b.prompt_tokens} ({b.evaluated_tokens} run, {b.reused_tokens} cached)"
    assert rows["finish"][:2] == ("end of reply", "end of reply")


def test_a_reply_without_the_figures_says_not_given() -> None:
    """A remote server that is not loopchat sends no prefill, entropies or pass times."""
    rec = _trace_records()[0]
    bare = [
        dataclasses.replace(st, raw_entropy=None, raw_prob=None, forward_ms=None, sample_ms=None) for st in rec.steps
    ]
    remote = ReplyRecord(
        number=9,
        mode=STREAM,
        messages=rec.messages,
        prefill=None,
        steps=bare,
        finish=dataclasses.replace(rec.finish, prefill_ms=None),
    )
    a, b = reply_stats(rec), reply_stats(remote)
    assert (b.passes, b.mean_entropy, b.mean_surprisal, b.pass_ms, b.entropies) == (None, None, None, (), ())
    rows = {r[0]: r[1:] for r in compare_rows(a, b)}
    for figure in ("forward passes", "prefill", "mean entropy", "mean surprisal", "decode pass, mean"):
        assert rows[figure][1] == NOT_GIVEN and rows[figure][2] == "", figure
    assert rows["tokens"][1] == str(rec.finish.completion_tokens)  # what the server did say
    sparks = spark_rows(a, b, 40)
    assert sparks[0][2] == NOT_GIVEN and sparks[0][1]


def test_sparklines_share_one_scale_and_one_count_per_cell() -> None:
    short, long_ = sparklines_same_scale([[1.0, 2.0], [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]], 3)
    assert len(short) == 1 and len(long_) == 3  # two values a cell for both
    assert short == "▂" and long_ == "▂██"  # 2 is low on the scale 1..8 both lines share
    a, b = sparklines_same_scale([[5.0] * 4, [1.0] * 4], 10)
    assert a == "████" and b == "▁▁▁▁"
    assert sparklines_same_scale([[], []], 10) == ["", ""]


# ---- the screen ------------------------------------------------------------------------
def _replay(tmp_path):
    return create_app(
        replay=str(COMPARE_TRACE), replay_speed=0, prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json"
    )


async def _both_replies(pilot) -> None:
    app = pilot.app
    await wait_for(
        pilot, lambda: len(comparable(app.conversation.replies)) == 2 and not app.backend.busy, 30, "the two replies"
    )
    await pilot.pause()


@pytest.mark.slow
async def test_ctrl_g_compares_the_last_two_replies_and_moves_a_side(tmp_path) -> None:
    app = _replay(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await _both_replies(pilot)
        r1, r2 = app.conversation.replies
        a, b = reply_stats(r1), reply_stats(r2)
        await pilot.press("ctrl+g")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, CompareScreen) and screen.sides == [0, 1] and screen.side == 1
        text = screen.text
        assert "▸ B · reply 2" in text and "A · reply 1" in text
        for figure in ("forward passes", "prefill", "TTFT", "decode", "tokens/s", "mean entropy", "mean surprisal"):
            assert figure in text
        assert f"{b.passes / a.passes:.2f}" in text  # the B/A column
        assert f"{a.mean_entropy:.2f} bits" in text and f"{b.mean_entropy:.2f} bits" in text
        assert "latency of each decode pass" in text and "raw entropy of each step" in text
        assert "6564" in text  # the replies' texts
        # ←: the reply before B's is A's, and a reply is not compared with itself: stays;
        # Tab marks A, →: A's next is B's, past it there is none: stays
        await pilot.press("left")
        assert screen.sides == [0, 1]
        await pilot.press("tab", "right")
        assert screen.sides == [0, 1] and screen.side == 0
        assert "▸ A · reply 1" in screen.text
        await pilot.press("left")  # before the first reply: stays
        assert screen.sides == [0, 1]
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, CompareScreen)
        await pilot.press("ctrl+g")  # Ctrl+G opens and closes it too
        await pilot.pause()
        assert isinstance(app.screen, CompareScreen)
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert not isinstance(app.screen, CompareScreen)


@pytest.mark.slow
async def test_the_selected_tokens_reply_is_compared_with_the_one_before(tmp_path) -> None:
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        for text in ("one", "two", "three"):
            await reply_to(pilot, text)
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert app.screen.sides == [1, 2]  # no token selected: the last reply and the one before
        await pilot.press("escape")
        app.action_select_token(2, 3)  # a token of reply 2 (what Alt+←/→ or a click selects)
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert app.screen.sides == [0, 1] and "▸ B · reply 2" in app.screen.text
        await pilot.press("escape")
        app.action_select_token(1, 3)  # the first reply has none before it: the next one
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert app.screen.sides == [0, 1]


async def test_a_side_moves_past_the_other_sides_reply_never_onto_it(tmp_path) -> None:
    """←/→ skipped nothing: B moved onto A's reply and the screen compared a reply with
    itself (every ratio ×1.00)."""
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        for text in ("one", "two", "three"):
            await reply_to(pilot, text)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen), 5, "the compare screen")
        screen = app.screen
        assert screen.sides == [1, 2]
        await pilot.press("left")  # B: reply 2 is A's, so reply 1
        assert screen.sides == [1, 0] and "▸ B · reply 1" in screen.text
        await pilot.press("right")  # back past A's reply 2 to reply 3
        assert screen.sides == [1, 2]
        await pilot.press("tab", "right")  # A: reply 3 is B's, and there is none after it
        assert screen.sides == [1, 2]
        await pilot.press("left", "left")
        assert screen.sides == [0, 2]


@pytest.mark.slow
async def test_ctrl_g_needs_two_finished_replies(tmp_path) -> None:
    app = fake_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_to(pilot, "hello")
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert not isinstance(app.screen, CompareScreen)
        assert any("two finished replies" in n.message for n in app.notices)
        await reply_to(pilot, "again")
        await palette_pick(pilot, "Compare two")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen), 5, "the compare screen")


async def test_the_keys_and_the_two_texts_read_apart_at_80_and_120_columns(tmp_path) -> None:
    """80x24: the keys under the screen were cut at "Es…" (how to close it); 120x40: a
    line of A's text that fills its column ran on into B's with one space between."""
    for size in ((80, 24), (120, 40)):
        app = _replay(tmp_path)
        async with app.run_test(size=size) as pilot:
            await _both_replies(pilot)
            await pilot.press("ctrl+g")
            await wait_for(pilot, lambda app=app: isinstance(app.screen, CompareScreen), 5, "the compare screen")
            rows = [strip.text for strip in app.screen._compositor.render_strips()]
            assert "Esc closes" in rows[-1] and "…" not in rows[-1], rows[-1]
            if size == (120, 40):
                row = next(r for r in rows if r.count("To calculate") == 2)
                b = row.index("To calculate", row.index("To calculate") + 1)
                assert row[b - 2 : b] == "  ", row


def test_compare_snapshot(snap_compare, tmp_path) -> None:
    async def open_compare(pilot) -> None:
        await _both_replies(pilot)
        await pilot.press("ctrl+g")
        await pilot.pause()

    assert snap_compare(_replay(tmp_path), terminal_size=(120, 40), run_before=open_compare)
