"""Parallel sequences' contract (batch.py): the pass report in JSON, the split, the one-line refusals."""

from __future__ import annotations

import dataclasses

import pytest

from loopchat.batch import BatchPass, check_n, fit_problem, pass_line, split_by_sequence
from loopchat.event_json import event_from_json_dict, to_json_dict
from loopchat.events import Finish, FinishReason, Message, Prefill, Start, Step
from loopchat.settings import SamplingSettings


def _step(**fields: object) -> Step:
    base = dict(index=1, token_id=5, piece="a", text="a", is_stop=False, raw_top=(), sampled_top=None)
    base |= dict(raw_prob=0.5, raw_rank=1, sampled_prob=0.5, sampled_rank=1, raw_entropy=1.0, sampled_entropy=1.0)
    base |= dict(candidates_kept=3, forward_ms=9.0, forward_tokens=4, sample_ms=0.1)
    base |= dict(settings=SamplingSettings(), settings_changed=(), n_past=20)
    return Step(**(base | fields))  # type: ignore[arg-type]


def test_a_batched_step_and_its_reply_round_trip_through_json() -> None:
    step = _step(sequence=2, batch=BatchPass(7, 4, 14.8, 11.2))
    data = to_json_dict(step)
    assert data["sequence"] == 2 and data["batch"] == [7, 4, 14.8, 11.2]
    assert event_from_json_dict(data) == step
    alone = to_json_dict(_step())
    assert "sequence" not in alone and "batch" not in alone  # a reply alone's trace is as before
    start = Start("m", None, None, None, None, None, (Message("user", "hi"),), None, None, SamplingSettings(), 5)
    for event in (start.__class__(**{**_fields(start), "sequence": 1, "sequences": 3}),):
        assert event_from_json_dict(to_json_dict(event)) == event
    assert event_from_json_dict(to_json_dict(_step(batch=BatchPass(1, 2, 3.0, None)))).batch == (1, 2, 3.0, None)


def _fields(event: object) -> dict:
    return {k: getattr(event, k) for k in event.__dataclass_fields__ if k != "kind"}  # type: ignore[attr-defined]


def test_split_by_sequence_gives_each_reply_the_shared_events() -> None:
    prefill = Prefill(10, 0, 10, 1, 5.0)
    fin = [Finish(FinishReason.STOP, 10, 1, 1, 5.0, 5.0, 0.0, 6.0, 0.0, "a", 11, 100, sequence=j) for j in (1, 0)]
    parts = split_by_sequence([prefill, _step(sequence=0), _step(sequence=1), *fin], 2)
    assert [[e.kind for e in p] for p in parts] == [["prefill", "step", "finish"]] * 2
    assert [p[-1].sequence for p in parts] == [0, 1]


def test_bad_n_and_a_context_too_small_are_one_line_each() -> None:
    for bad in (0, 17, -1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="n must be a whole number from 1 to 16"):
            check_n(bad)
    assert check_n(16) == 16
    assert fit_problem(40, 4, 512, 4096) is None
    problem = fit_problem(100, 8, 512, 4096)
    assert problem is not None and "\n" not in problem
    assert "need 4196 cells" in problem and "n at most 7" in problem and "max_tokens at most 499" in problem
    assert pass_line(BatchPass(3, 4, 14.84, 11.2)) == "4 tokens in 14.8 ms · one sequence: 11.2 ms"
    assert pass_line(BatchPass(9, 1, 8.3, None)) == "1 token in 8.3 ms · one sequence: not measured yet"


def test_a_batch_trace_reads_back_whole_and_a_cut_one_ends_only_the_open_replies(tmp_path) -> None:
    from loopchat.trace import TraceWriter, read_trace

    start = Start("m", None, None, 100, 10, 1, (Message("user", "hi"),), None, (1, 2), SamplingSettings(), 5)
    starts = [dataclasses.replace(start, sequence=j, sequences=2) for j in (0, 1)]
    prefill = Prefill(2, 0, 2, 1, 5.0)
    steps = [_step(index=0, sequence=j, n_past=3) for j in (0, 1)]
    fin = Finish(FinishReason.STOP, 2, 1, 1, 5.0, 5.0, 0.0, 6.0, 0.0, "a", 3, 100, sequence=1)
    path = tmp_path / "t.jsonl"
    with TraceWriter(path) as trace:
        for event in (*starts, prefill, *steps, fin):
            trace.write(event)
    header, traced = read_trace(path)
    assert header.get("cut_short") is True  # sequence 0 never finished: only it gets a made-up Finish
    made = [t.event for t in traced if t.synthetic]
    assert len(made) == 1 and made[0].sequence == 0 and made[0].text == "a" and made[0].steps == 1
    with TraceWriter(path) as trace:
        for event in (*starts, prefill, *steps, fin, dataclasses.replace(fin, sequence=0)):
            trace.write(event)
    header, traced = read_trace(path)
    assert not header.get("cut_short") and not any(t.synthetic for t in traced)


def test_a_batched_step_is_stored_in_the_history_and_read_back_whole() -> None:
    from loopchat.history.step_codec import decode_steps, encode_steps

    steps = [_step(sequence=1, batch=BatchPass(3, 4, 14.8, 11.2)), _step(index=0, sequence=1)]
    back = decode_steps(encode_steps(steps))
    assert back == steps and isinstance(back[0].batch, BatchPass)


def test_a_played_trace_of_a_batch_plays_its_first_reply_and_says_so() -> None:
    from test_session import Backend, reply_events

    from loopchat.chat.session import ChatSession
    from loopchat.events import RunDone

    s = ChatSession(Backend())
    events = [reply_events(1, (Message("user", "q"),), text) for text in ("one two", "three four")]
    tagged = []
    for j, evs in enumerate(events):
        for e in evs[:-1]:  # (each list's RunDone: one at the end)
            tagged.append(e if isinstance(e, Prefill) else dataclasses.replace(e, sequence=j))
    tagged = [dataclasses.replace(e, sequences=2) if isinstance(e, Start) else e for e in tagged]
    u = s.consume([*tagged, RunDone(1)])
    [(_, rec)] = u.started
    assert rec.text == "one two" and u.finished == [rec]
    assert any("2 replies written in one batch: the first is played" in w for w in u.warnings)


def test_shift_f5_is_refused_before_anything_when_four_replies_cannot_fit() -> None:
    from test_session import READY, Backend, reply_events

    from loopchat.chat.conversation import STREAM
    from loopchat.chat.session import ChatSession, Refused

    backend = Backend()
    backend.can_branch = True  # (a model run here)
    s = ChatSession(backend)
    s.consume([READY])
    s.send("q", STREAM)
    s.consume(reply_events(1, (Message("user", "q"),)))
    s.settings = s.settings.replace(max_tokens=600)  # 4 x 600 + the prompt > 2048, the reply's n_ctx
    with pytest.raises(Refused, match="4 replies of up to 600 tokens .* set max_tokens to 511 at most"):
        s.write_n(STREAM, 4)
    last = s.conversation.last_in_history()
    assert last is not None and not last.hidden and len(backend.runs) == 1  # nothing set aside, nothing run
