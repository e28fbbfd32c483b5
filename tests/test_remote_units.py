"""The remote backend's pure parts: server-sent events from bytes, a server's chunks into
events (wire_reader.py), the base URL, and "not given" surviving a trace."""

from __future__ import annotations

import math

import pytest
from remote_servers import OK_CHUNKS, OK_USAGE, chunk

from loopchat.backends.remote import URLProblem, api_base
from loopchat.backends.sse import SSESplitter
from loopchat.backends.wire_reader import ServerError, WireError, WireReader, split_text
from loopchat.event_json import event_from_json_dict, to_json_dict
from loopchat.events import Candidate, Finish, FinishReason, Message, Prefill, Start, Step
from loopchat.settings import SamplingSettings
from loopchat.wire import WireOptions, WireSerializer

SETTINGS = SamplingSettings(seed=1)


def reader(**kw) -> WireReader:
    args = dict(source="http://h/v1", model="m", messages=(Message("user", "hi"),), settings=SETTINGS, top_logprobs=10)
    args.update(kw)
    return WireReader(**args)


# ---- SSE ----------------------------------------------------------------------------------


def test_sse_events_keep_their_exact_bytes_whatever_the_line_ends_and_the_cuts() -> None:
    raw = b'\xef\xbb\xbfdata: {"a":1}\n\n: ping\r\n\r\ndata: x\ndata:y\r\revent: e\ndata: [DONE]\n\n'
    whole = SSESplitter().feed(raw)
    assert [(e.text, e.data) for e in whole] == [
        ('data: {"a":1}', '{"a":1}'),
        (": ping", None),
        ("data: x\ndata:y", "x\ny"),
        ("event: e\ndata: [DONE]", "[DONE]"),
    ]
    assert sum(e.nbytes for e in whole) == len(raw) - 3  # all but the byte order mark
    for size in (1, 2, 5):  # any cut between reads gives the same events
        s = SSESplitter()
        got = [e for i in range(0, len(raw), size) for e in s.feed(raw[i : i + size])]
        assert got == whole, size
        assert s.pending() == b""


def test_sse_a_cut_stream_leaves_its_last_bytes_pending() -> None:
    s = SSESplitter()
    assert [e.data for e in s.feed(b'data: 1\n\ndata: {"cho')] == ["1"]
    assert s.pending() == b'data: {"cho'


# ---- the base URL -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, base",
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1"),
        ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1"),
        ("https://api.example.com/openai/v1/chat/completions", "https://api.example.com/openai/v1"),
        ("  http://box:8080/v1/models ", "http://box:8080/v1"),
    ],
)
def test_the_base_url_with_or_without_v1(url, base) -> None:
    assert api_base(url) == base


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://h/v1", "http://", "http://h/v1?x=1"])
def test_a_url_that_is_not_a_base_is_one_line(url) -> None:
    with pytest.raises(URLProblem) as err:
        api_base(url)
    assert "\n" not in str(err.value) and "e.g. http://127.0.0.1:8000/v1" in str(err.value)


# ---- text among tokens -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, pieces, parts",
    [
        ("Hi there", ["Hi", " there"], ["Hi", " there"]),
        ("é", ["", ""], ["", "é"]),  # a character split over two tokens: to the one completing it
        ("📱\n❤", ["", "", "", "\n", "", "", ""], ["", "", "📱", "\n", "", "", "❤"]),
        ("a\ufffdb", ["a", "\ufffd", "b"], ["a", "\ufffd", "b"]),
        ("xyz", ["ab", "c"], ["xyz", ""]),  # out of step: the rest where matching failed
        ("", ["", ""], ["", ""]),
    ],
)
def test_split_text_gives_each_token_its_text(content, pieces, parts) -> None:
    assert split_text(content, pieces) == parts
    assert "".join(split_text(content, pieces)) == content


# ---- chunks into events ------------------------------------------------------------------------


def test_chunks_of_any_server_become_steps_with_only_what_they_give() -> None:
    r = reader(top_logprobs=1)
    events = [e for i, c in enumerate(OK_CHUNKS) for e in r.chunk(c, 10.0 * (i + 1))]
    assert r.chunk(OK_USAGE, 60.0) == []
    start, steps = events[0], events[1:]
    assert isinstance(start, Start) and start.source == "http://h/v1" and start.top_k_report == 1
    assert [s.text for s in steps] == ["Hi", "", "é", " there"]
    assert [len(s.raw_top) for s in steps] == [1, 1, 1, 1]  # at most the top_logprobs asked for
    assert [s.arrival_ms for s in steps] == [20.0, 10.0, 0.0, 10.0]
    finish = r.end(70.0)
    assert isinstance(finish, Finish) and finish.reason == FinishReason.STOP and finish.completion_tokens == 4
    assert finish.decode_ms == 20.0 and finish.tokens_per_s == pytest.approx(3 / 0.02)


def test_a_drawn_token_appended_beyond_the_top_asked_for_has_no_rank() -> None:
    c = chunk("x", [("x", -3.0, None)])
    lp = c["choices"][0]["logprobs"]["content"][0]
    lp["top_logprobs"] = [
        {"token": "a", "logprob": -0.5},
        {"token": "b", "logprob": -1.0},
        {"token": "x", "logprob": -3.0},
    ]
    r = reader(top_logprobs=2)
    (step,) = r.chunk(c, 5.0)[1:]
    assert step.raw_rank is None and step.raw_prob == pytest.approx(math.exp(-3.0))
    assert [c.text for c in step.raw_top] == ["a", "b"]


def test_a_chunk_without_logprobs_is_a_step_with_its_text_only() -> None:
    r = reader()
    (_, step) = r.chunk(chunk("Hello"), 5.0)
    assert step.text == step.piece == "Hello" and step.raw_top == () and step.raw_prob is None
    assert r.end(6.0).completion_tokens is None  # chunks are not tokens: not given without usage


def test_legacy_completion_chunks() -> None:
    r = reader(top_logprobs=5)
    obj = {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "m",
        "choices": [
            {
                "text": " Paris",
                "index": 0,
                "finish_reason": None,
                "logprobs": {
                    "tokens": [" Paris"],
                    "token_logprobs": [-0.2],
                    "text_offset": [0],
                    "top_logprobs": [{" the": -2.0, " Paris": -0.2}],
                },
            }
        ],
    }
    (_, step) = r.chunk(obj, 3.0)
    assert step.text == " Paris" and step.raw_rank == 1 and [c.text for c in step.raw_top] == [" Paris", " the"]


@pytest.mark.parametrize(
    "obj, needle",
    [
        ([1, 2], "a chunk is a list"),
        ({"choices": "x"}, "choices is text"),
        ({"choices": [{"delta": {"content": 5}}]}, "content is a number"),
        (
            {"choices": [{"delta": {"content": "a"}, "logprobs": {"content": [{"token": "a", "logprob": "x"}]}}]},
            "logprob is str",
        ),
        ({"id": "x"}, "neither choices nor usage"),
    ],
)
def test_malformed_chunks_say_what_is_wrong(obj, needle) -> None:
    with pytest.raises(WireError, match=needle):
        reader().chunk(obj, 1.0)


def test_an_error_in_the_stream_is_the_servers_message() -> None:
    with pytest.raises(ServerError, match="overloaded"):
        reader().chunk({"error": {"message": "overloaded", "type": "server_error"}}, 1.0)


def test_a_loopchat_servers_chunks_are_its_engines_events() -> None:
    """The wire serializer's chunks (what `loopchat serve` sends) read back into the very
    events, Start marked with the server, each Step with its arrival gap."""
    settings = SamplingSettings(seed=3)
    start = Start("m", "/models/m.gguf", 10, 512, 100, 2, (Message("user", "hi"),), "<p>hi", (1, 2), settings, 10)
    prefill = Prefill(2, 0, 2, 1, 4.0)
    cands = (Candidate(7, "Hi", 0.9), Candidate(8, "Yo", 0.1))
    steps = [
        Step(
            i,
            7,
            "Hi",
            "Hi",
            False,
            cands,
            cands[:1],
            0.9,
            1,
            1.0,
            1,
            0.5,
            0.0,
            1,
            3.0,
            1,
            0.2,
            settings,
            (),
            3 + i,
            elapsed_ms=5.0 + i,
            threads=2,
            piece_bytes=b"Hi",
        )
        for i in range(2)
    ]
    finish = Finish(FinishReason.LENGTH, 2, 2, 2, 4.0, 5.0, 1.0, 7.0, 1000.0, "HiHi", 3, 512)
    ser = WireSerializer("m", WireOptions(logprobs=True, top_logprobs=2, include_usage=True))
    chunks = [c for ev in (start, prefill, *steps, finish) for c in ser.feed(ev)]
    r = reader()
    got = [e for i, c in enumerate(chunks) for e in r.chunk(c, 100.0 + i)]
    assert r.extended and isinstance(got[0], Start) and got[0].source == "http://h/v1"
    assert got[0].prompt_token_ids == (1, 2) and got[1] == prefill
    assert [s.arrival_ms for s in got[2:]] == [101.0, 1.0]
    assert [s.forward_ms for s in got[2:]] == [3.0, 3.0] and got[2].sampled_top == cands[:1]
    assert r.end(200.0) == finish  # the server's own Finish, handed on at the end


# ---- "not given" in a trace ----------------------------------------------------------------------


def test_not_given_survives_a_trace_round_trip() -> None:
    r = reader()
    events = [e for i, c in enumerate(OK_CHUNKS) for e in r.chunk(c, 10.0 * (i + 1))] + [r.end(60.0)]
    for ev in events:
        back = event_from_json_dict(to_json_dict(ev))
        assert back == ev
    d = to_json_dict(events[1])
    assert d["sampled_top"] is None and d["forward_ms"] is None and d["raw_top"][0][0] is None
    assert d["arrival_ms"] == 20.0 and d["piece_bytes"] == "4869"


def _replay_pair(original_ids: list[int], replay_ids: list[int], source: str) -> tuple:
    """Two finished replies (the second F9's replay of the first) of the given token ids: the id 2
    a step that adds no text (an end token a server sent as a chunk, not marked a stop)."""
    from loopchat.chat.conversation import STREAM, ReplyRecord

    def step(i: int, token: int) -> Step:
        text = "" if token == 2 else f"t{token}"
        return Step(i, token, text, text, False, (), None, None, None, None, None, None, None, None, None, None, None,
                    SamplingSettings(), (), None)  # fmt: skip

    def reply(number: int, ids: list[int], replay_of: int | None) -> ReplyRecord:
        start = Start("m", None, None, None, None, None, (Message("user", "hi"),), None, None, SamplingSettings(), 5,
                      source=source)  # fmt: skip
        text = "".join(f"t{t}" for t in ids if t != 2)
        finish = Finish(FinishReason.STOP, 5, len(ids), len(ids), 1.0, 1.0, 0.0, 1.0, 0.0, text, 5 + len(ids), 512)
        steps = [step(i, t) for i, t in enumerate(ids)]
        return ReplyRecord(number, STREAM, (), replay_of=replay_of, start=start, steps=steps, finish=finish)

    return reply(1, original_ids, None), reply(2, replay_ids, 1)


def test_a_remote_replay_is_the_same_with_or_without_the_end_tokens_chunk() -> None:
    """llama-server sends the end token's chunk (its logprobs, no text) in one reply and not in another
    of the same tokens (seen in a clean clone's CI): the replay check leaves a remote reply's last
    text-less step out, and still tells a real difference; a local reply's steps all count."""
    from loopchat.chat.replay_check import replay_verdict

    url = "http://127.0.0.1:8080"
    original, replay = _replay_pair([5, 6, 7], [5, 6, 7, 2], url)
    assert replay_verdict(replay, original) == "same tokens as reply 1 (3)"
    original, replay = _replay_pair([5, 6, 7, 2], [5, 6, 8, 2], url)
    assert (
        replay_verdict(replay, original) == "differs from reply 1 from token 3: this server did not reproduce the seed"
    )
    original, replay = _replay_pair([5, 6, 7], [5, 6, 7, 2], "")
    assert replay_verdict(replay, original) == "differs from reply 1 from token 4: the same seed drew other tokens"
