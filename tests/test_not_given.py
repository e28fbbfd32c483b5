"""Values the events may leave out (None: a remote server's reply did not give them) are
said as not given where they are shown or sent on, never a crash. Found by mypy
(issue 23): each of these raised a TypeError before. Model-free: a recorded reply
(tests/data/reply.jsonl) with those fields set to None."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from loopchat.chat.conversation import ReplyRecord
from loopchat.events import Finish, Start, Step
from loopchat.trace import read_trace
from loopchat.wire import NO_LOGPROB, WireOptions, WireSerializer, extension_events

TRACE = Path(__file__).parent / "data" / "reply.jsonl"


def _not_given() -> list:
    """The recorded reply as a server that gives no model path, no raw probability and no
    prompt token count would leave it."""
    _, traced = read_trace(TRACE)
    out = []
    for event in (t.event for t in traced):
        if isinstance(event, Start):
            event = replace(event, model_path=None)
        elif isinstance(event, Step):
            event = replace(event, raw_prob=None)
        elif isinstance(event, Finish):
            event = replace(event, prompt_tokens=None)
        out.append(event)
    return out


def test_the_wire_says_not_given_where_the_events_do():
    events = _not_given()
    s = WireSerializer("m", WireOptions(logprobs=True, top_logprobs=2, include_usage=True), id="x", created=1)
    chunks = [c for e in events for c in s.feed(e)]
    steps = [e for e in events if isinstance(e, Step) and not e.is_stop]
    tokens = [c for c in chunks[1:] if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(tokens) == len(steps) > 0
    # the drawn token's own logprob: not given, as OpenAI says "not in the top" (-9999)
    assert all(c["choices"][0]["logprobs"]["content"][0]["logprob"] == NO_LOGPROB for c in tokens)
    usage = chunks[-1]["usage"]
    finish = next(e for e in events if isinstance(e, Finish))
    assert usage["prompt_tokens"] is None and usage["total_tokens"] is None
    assert usage["completion_tokens"] == finish.completion_tokens
    starts = [e for c in chunks for e in extension_events(c) if isinstance(e, Start)]
    assert len(starts) == 1 and starts[0].model_path is None


def test_a_reply_without_pass_times_has_no_live_rate():
    events = _not_given()
    steps = [e for e in events if isinstance(e, Step)]
    timed = ReplyRecord(number=1, mode="stream", messages=(), steps=steps)
    assert timed.live_tokens_per_s() is not None  # the recorded times give a rate
    untimed = ReplyRecord(number=1, mode="stream", messages=(), steps=[replace(s, forward_ms=None) for s in steps])
    assert untimed.live_tokens_per_s() is None
