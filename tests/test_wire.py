"""wire.py: a recorded run's events as OpenAI's chunks and bodies, and back."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from loopchat.event_json import to_json_dict
from loopchat.events import Finish, FinishReason, Start, Step
from loopchat.trace import read_trace
from loopchat.wire import (
    DONE_LINE,
    EXTENSION_KEY,
    NO_LOGPROB,
    WireOptions,
    WireSerializer,
    extension_events,
    sse_line,
)

TRACE = Path(__file__).parent / "data" / "reply.jsonl"


@pytest.fixture(scope="module")
def events():
    _, traced = read_trace(TRACE)
    return [t.event for t in traced]


def _feed(events, options):
    s = WireSerializer("smollm2", options, id="chatcmpl-x", created=1700000000)
    chunks = [c for e in events for c in s.feed(e)]
    return s, chunks


def test_a_chat_stream_is_role_then_one_chunk_per_token_then_finish_then_usage(events):
    _, chunks = _feed(events, WireOptions(logprobs=True, top_logprobs=5, include_usage=True))
    steps = [e for e in events if isinstance(e, Step)]
    finish = next(e for e in events if isinstance(e, Finish))
    reply_steps = [s for s in steps if not s.is_stop]
    assert len(chunks) == 1 + len(reply_steps) + 2
    assert {c["id"] for c in chunks} == {"chatcmpl-x"} and {c["created"] for c in chunks} == {1700000000}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    body = chunks[1:-2]
    assert [c["choices"][0]["delta"]["content"] for c in body] == [s.text for s in reply_steps]
    assert "".join(s.text for s in reply_steps) == finish.text
    assert chunks[-2]["choices"][0]["delta"] == {} and chunks[-2]["choices"][0]["finish_reason"] == finish.reason.value
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == finish.completion_tokens
    assert chunks[-1]["usage"]["prompt_tokens"] == finish.prompt_tokens
    assert all(c["usage"] is None for c in chunks[:-1])  # null on every chunk but the last


def test_logprobs_are_the_raw_softmax_of_the_steps(events):
    _, chunks = _feed(events, WireOptions(logprobs=True, top_logprobs=3))
    reply_steps = [s for s in events if isinstance(s, Step) and not s.is_stop]
    for chunk, step in zip(chunks[1:], reply_steps):
        (entry,) = chunk["choices"][0]["logprobs"]["content"]
        assert entry["token"] == step.piece
        assert entry["logprob"] == pytest.approx(math.log(step.raw_prob))
        assert [t["token"] for t in entry["top_logprobs"]] == [c.text for c in step.raw_top[:3]]
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx(
            [math.log(c.prob) for c in step.raw_top[:3]]
        )
        for t in entry["top_logprobs"]:
            assert t["bytes"] is None or bytes(t["bytes"]).decode("utf-8") == t["token"]


def test_the_extension_gives_back_the_very_events(events):
    _, chunks = _feed(events, WireOptions())
    back = [e for c in json.loads(json.dumps(chunks)) for e in extension_events(c)]
    assert len(back) == len(events)
    for a, b in zip(back, events):
        if isinstance(b, Start):  # the server's folders are not sent
            assert a.model_path == Path(b.model_path).name
            b = replace(b, model_path=a.model_path)
        assert to_json_dict(a) == to_json_dict(b)
    # and without the extension, the chunks are plain OpenAI ones
    _, plain = _feed(events, WireOptions(extension=False))
    assert not any(EXTENSION_KEY in c for c in plain)


def test_the_blocking_body_holds_the_same_text_and_every_event(events):
    s, chunks = _feed(events, WireOptions(stream=False, logprobs=True, top_logprobs=2))
    body = json.loads(json.dumps(s.body()))
    finish = next(e for e in events if isinstance(e, Finish))
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": finish.text, "refusal": None}
    assert len(body["choices"][0]["logprobs"]["content"]) == sum(
        1 for e in events if isinstance(e, Step) and not e.is_stop
    )
    assert len(extension_events(body)) == len(events)


def test_legacy_completions_carry_text_and_offsets(events):
    s, chunks = _feed(events, WireOptions(chat=False, logprobs=True, top_logprobs=2))
    reply_steps = [e for e in events if isinstance(e, Step) and not e.is_stop]
    assert {c["object"] for c in chunks} == {"text_completion"}
    texts = [c["choices"][0]["text"] for c in chunks[:-1]]
    assert texts == [st.text for st in reply_steps]  # no role chunk on this endpoint
    offsets = [c["choices"][0]["logprobs"]["text_offset"][0] for c in chunks[:-1]]
    assert offsets == [sum(len(st.text) for st in reply_steps[:i]) for i in range(len(reply_steps))]
    for c, st in zip(chunks, reply_steps):
        top = c["choices"][0]["logprobs"]["top_logprobs"][0]
        assert st.piece in top and len(top) <= 3  # the drawn token is always there
    assert s.body()["choices"][0]["logprobs"]["tokens"] == [st.piece for st in reply_steps]


def test_an_error_finish_is_an_error_object_and_no_body(events):
    start = [e for e in events if not isinstance(e, Finish)]
    finish = next(e for e in events if isinstance(e, Finish))
    broken = replace(finish, reason=FinishReason.ERROR, error="llama_decode returned -1")
    s, chunks = _feed([*start, broken], WireOptions())
    assert chunks[-1] == {
        "error": {
            "message": "llama_decode returned -1",
            "type": "server_error",
            "param": None,
            "code": "generation_error",
        }
    }
    assert "error" in s.body()


def test_sse_framing_and_zero_probabilities():
    assert sse_line({"a": "é"}) == 'data: {"a":"é"}\n\n'
    assert DONE_LINE == "data: [DONE]\n\n"
    from loopchat.wire import logprob

    assert logprob(0.0) == NO_LOGPROB and logprob(1.0) == 0.0
