"""`loopchat serve`: a real server in a child process on 127.0.0.1 at a free port, driven
by the official `openai` client (and httpx for the raw bytes). No mocked HTTP.

One server serves the module (--queue 1, the API key from LOOPCHAT_API_KEY; conftest.py's
queue_one_server, shared with test_dry_settings; the default --parallel 4); the Ctrl+C tests
and the start-up errors start their own, the turns and queue tests one with --parallel 1.
"""

from __future__ import annotations

import json
import math
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from serve_process import KEY, Serve

from loopchat.config import SMOLLM2_SAMPLING
from loopchat.engine.engine import Engine
from loopchat.events import Finish, Message, Start, Step
from loopchat.stop_strings import StopStrings
from loopchat.wire import DONE_LINE, WireOptions, WireSerializer, extension_events

pytestmark = [pytest.mark.model, pytest.mark.server]

PY = sys.executable
MODEL = "smollm2-135m-instruct"
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Tell me about the sea in three sentences."},
]
DOCUMENT = "Once upon a time, in a small village by the sea, there lived"


@pytest.fixture(scope="module")
def server(queue_one_server: Serve) -> Serve:
    return queue_one_server  # the session's (conftest.py): one launch for this module and test_dry_settings


@pytest.fixture(scope="module")
def client(server: Serve) -> OpenAI:
    return server.client(KEY)


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def content_of(stream: Any) -> str:
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


# ---- the model, /health ---------------------------------------------------------------


def test_models_and_health(server: Serve, client: OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    health = httpx.get(server.url + "/health", timeout=30)  # open without the key
    assert health.status_code == 200
    assert health.json()["status"] == "ok" and health.json()["model"] == MODEL
    assert health.json()["queue"] == 1


# ---- the same loop, streamed or blocking -----------------------------------------------


def test_streaming_and_blocking_give_the_same_chat_text(server: Serve, client: OpenAI) -> None:
    kw: dict[str, Any] = dict(model=MODEL, messages=MESSAGES, seed=11, temperature=0.9, max_tokens=40)
    # first the same prompt once: both runs then reuse the same part of the KV cache
    client.chat.completions.create(**{**kw, "max_tokens": 1})
    streamed = content_of(client.chat.completions.create(**kw, stream=True))
    blocking = client.chat.completions.create(**kw)
    assert streamed and streamed == blocking.choices[0].message.content
    assert blocking.object == "chat.completion" and blocking.usage is not None
    # cache_prompt false (llama.cpp's name): the whole prompt is evaluated each time
    nocache = {**kw, "extra_body": {"cache_prompt": False}}
    first = content_of(client.chat.completions.create(**nocache, stream=True))
    assert first == client.chat.completions.create(**nocache).choices[0].message.content


def test_streaming_and_blocking_give_the_same_completion_text(server: Serve, client: OpenAI) -> None:
    kw: dict[str, Any] = dict(
        model=MODEL,
        prompt=DOCUMENT,
        seed=5,
        temperature=0.8,
        max_tokens=30,
        extra_body={"cache_prompt": False, "loopchat": {"prompt": True}},
    )
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True) if c.choices)
    blocking = client.completions.create(**kw)
    assert streamed and streamed == blocking.choices[0].text
    assert blocking.object == "text_completion"
    # the document is the whole prompt: no chat template around it
    start = extension_events(blocking.to_dict())[0]
    assert isinstance(start, Start) and start.prompt_text == DOCUMENT


# ---- the chunks on the wire ------------------------------------------------------------


def test_the_raw_stream_is_wire_py_s_lines_chunk_by_chunk(server: Serve) -> None:
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "stream": True,
        "max_tokens": 12,
        "seed": 3,
        "logprobs": True,
        "top_logprobs": 3,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=auth(), timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode("utf-8")
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events[:-1])
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-2]]

    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert len({c["created"] for c in chunks}) == 1
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and {c["model"] for c in chunks} == {MODEL}
    role, *tokens, last, usage = chunks
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role["choices"][0]["finish_reason"] is None and role["usage"] is None
    assert last["choices"][0]["finish_reason"] in ("stop", "length") and last["usage"] is None
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(tokens)
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + len(tokens)
    for i, chunk in enumerate(tokens):  # one chunk per step, with that step's text and logprobs
        choice = chunk["choices"][0]
        assert choice["finish_reason"] is None and chunk["usage"] is None
        assert chunk["loopchat"]["step"]["index"] == i
        assert choice["delta"]["content"] == chunk["loopchat"]["step"]["text"]
        assert len(choice["logprobs"]["content"]) == 1 and len(choice["logprobs"]["content"][0]["top_logprobs"]) == 3
    finish = next(e for e in extension_events(last) if isinstance(e, Finish))
    assert finish.completion_tokens == len(tokens)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1]) == finish.text

    # the very bytes wire.py gives for the engine's events (carried in the extension)
    serializer = WireSerializer(
        MODEL, WireOptions(logprobs=True, top_logprobs=3, include_usage=True), id=role["id"], created=role["created"]
    )
    again = [line for c in chunks for e in extension_events(c) for line in serializer.lines(e)]
    assert "".join(again) + DONE_LINE == raw


def test_the_usage_chunk_through_the_openai_client(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=6, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"


def test_logprobs_equal_the_engine_s_step_records(
    server: Serve, client: OpenAI, model_path: Path, tmp_path: Path
) -> None:
    kw: dict[str, Any] = dict(
        model=MODEL,
        messages=MESSAGES,
        seed=21,
        temperature=0.8,
        top_p=0.95,
        max_tokens=16,
        logprobs=True,
        top_logprobs=5,
    )
    chunks = list(client.chat.completions.create(**kw, stream=True, extra_body={"cache_prompt": False}))
    steps = []
    for chunk in chunks:
        events = extension_events(chunk.to_dict())
        step = next((e for e in events if isinstance(e, Step) and not e.is_stop), None)
        if step is None:
            assert not chunk.choices or chunk.choices[0].logprobs is None
            continue
        steps.append(step)
        (entry,) = chunk.choices[0].logprobs.content
        assert entry.token == step.piece and entry.bytes == list(step.piece_bytes)
        assert entry.logprob == math.log(step.raw_prob)
        assert [(t.token, t.logprob) for t in entry.top_logprobs] == [
            (c.text, math.log(c.prob)) for c in step.raw_top[:5]
        ]
    assert len(steps) >= 2

    # a direct run of the engine, the same model, threads, settings and seed: the same draws
    settings = SMOLLM2_SAMPLING.replace(seed=21, temperature=0.8, top_p=0.95, max_tokens=16)
    start = extension_events(chunks[0].to_dict())[0]
    assert isinstance(start, Start) and start.settings == settings
    with Engine(model_path, n_ctx=start.n_ctx, threads=1, log_path=tmp_path / "llama.log") as engine:
        direct = [
            e
            for e in engine.generate([Message(m["role"], m["content"]) for m in MESSAGES], settings)
            if isinstance(e, Step) and not e.is_stop
        ]
    assert [s.token_id for s in direct] == [s.token_id for s in steps]
    assert [s.raw_prob for s in direct] == [s.raw_prob for s in steps]


# ---- errors in OpenAI's shape ----------------------------------------------------------


@pytest.mark.parametrize(
    "extra, needle, param",
    [
        ({"n": 17}, "n must be a whole number from 1 to 16", "n"),
        ({"tools": [{"type": "function"}]}, '{"type": "function", "function": {"name"', "tools[0]"),
        ({"temperature": 9}, "temperature must be between 0 and 5", "temperature"),
        ({"top_p": 0}, "top_p must be above 0", "top_p"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs must be from 0 to 20", "top_logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "up to 4 strings", "stop"),
        ({"response_format": {"type": "xml"}}, "response_format", "response_format"),
        ({"extra_body": {"grammar": "root ::= foo"}}, "line 1, column 10", "grammar"),
        ({"frequency_penalty": 3}, "frequency_penalty must be between -2 and 2", "frequency_penalty"),
    ],
)
def test_unsupported_or_bad_parameters_are_400(client: OpenAI, extra: dict, needle: str, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, **extra)
    assert needle in info.value.message and info.value.param == param


def test_harmless_unknown_keys_are_ignored(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=3,
        user="someone",
        frequency_penalty=0,
        presence_penalty=0,
        extra_body={"some_future_field": {"x": 1}},
    )
    assert reply.choices[0].finish_reason == "length"


def test_openai_s_frequency_and_presence_penalties_are_a_stage_of_the_sampler(client: OpenAI) -> None:
    """The OpenAI playground's classic example (presence_penalty=0.6, frequency_penalty) runs
    unchanged, where it was a 400; each step records the settings and the stage (after the
    repeat penalty, as llama.cpp's penalties sampler), which changed the logits of the tokens
    the context holds."""
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=12,
        temperature=0.9,
        top_p=1,
        frequency_penalty=0.5,
        presence_penalty=0.6,
        seed=3,
        stream=True,
    )
    steps = [c.model_extra["loopchat"]["step"] for c in stream if "step" in (c.model_extra or {}).get("loopchat", {})]
    assert len(steps) == 12
    for step in steps:
        assert (step["settings"]["frequency_penalty"], step["settings"]["presence_penalty"]) == (0.5, 0.6)
        names = [row[0] for row in step["stages"]]
        assert names[:3] == ["repeat_penalty", "frequency_presence", "dry"], names
        assert step["stages"][1][7] > 0  # logits changed: the prompt's tokens are in the window


def test_the_api_key_is_required(server: Serve) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        server.client(key="wrong").chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    assert "incorrect API key" in info.value.message
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": MESSAGES}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert "Authorization: Bearer" in r.json()["error"]["message"]


def test_malformed_json_and_unknown_paths_in_openai_s_shape(server: Serve) -> None:
    r = httpx.post(server.url + "/v1/chat/completions", content=b'{"messages": [', headers=auth(), timeout=30)
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/audio/speech", json={}, headers=auth(), timeout=30)
    assert r.status_code == 404 and "/v1/chat/completions" in r.json()["error"]["message"]
    assert "POST /v1/embeddings" in r.json()["error"]["message"]


def test_a_prompt_too_long_is_400_before_the_stream_starts(client: OpenAI) -> None:
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=MODEL, prompt="word " * 5000, max_tokens=4, stream=stream)
        assert "too long for the context" in info.value.message
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, logprobs=6)


# ---- stop strings ----------------------------------------------------------------------


def test_stop_strings_end_the_reply_before_them(client: OpenAI) -> None:
    kw: dict[str, Any] = dict(
        model=MODEL, prompt=DOCUMENT, temperature=0, max_tokens=40, extra_body={"cache_prompt": False}
    )
    full = client.completions.create(**kw).choices[0].text
    k = len(full) // 2
    stop = full[k : k + 3]
    k = full.index(stop)  # its first occurrence
    assert k > 0
    for stops in (stop, [stop, "\u2603never"]):
        blocking = client.completions.create(**kw, stop=stops).choices[0]
        assert (blocking.text, blocking.finish_reason) == (full[:k], "stop")
        chunks = [c for c in client.completions.create(**kw, stop=stops, stream=True) if c.choices]
        assert "".join(c.choices[0].text for c in chunks) == full[:k]
        assert chunks[-1].choices[0].finish_reason == "stop"
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=30)
    text = chat.choices[0].message.content
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    streamed = content_of(
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, temperature=0, max_tokens=30, stop=stop, stream=True
        )
    )
    assert streamed == text[: text.index(stop)]


def test_stop_strings_hold_back_what_may_begin_one() -> None:
    s = StopStrings(["END", "xyz"])
    assert s.feed("hello E") == ("hello ", False)  # "E" may begin END
    assert s.feed("N") == ("", False)
    assert s.feed("Dless") == ("", True)  # cut before END
    s = StopStrings(["END"])
    assert s.feed("a E") == ("a ", False)
    assert s.feed("x") == ("Ex", False)  # released: not END after all
    assert s.feed("EN", final=True) == ("EN", False)  # the reply ends anyway: all of it


# ---- one loop: disconnects, turns, the queue ---------------------------------------------


def _long(client: OpenAI, **extra: Any) -> Any:
    """A stream that would run 3000 steps if nobody stopped it."""
    return client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=3000, stream=True, extra_body={"ignore_eos": True}, **extra
    )


def test_a_client_that_disconnects_stops_the_loop_within_one_step(server: Serve, client: OpenAI) -> None:
    mark = len(server.err)
    stream = _long(client)
    read = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content is not None and chunk.choices[0].delta.role is None:
            read += 1
            if read == 5:
                break
    stream.close()
    m = server.wait_for(r"client disconnected after (\d+) steps \(the loop ran (\d+) more\)", start=mark)
    at, more = int(m.group(1)), int(m.group(2))
    assert at >= 5 and more <= 1 and at + more < 3000
    assert "finish: cancelled" in m.string and " 499 · stream" in m.string
    assert httpx.get(server.url + "/health", timeout=30).json()["generating"] is False
    assert (
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2).choices[0].finish_reason
        == "length"
    )


def test_a_blocking_client_that_goes_away_stops_the_loop(server: Serve) -> None:
    mark = len(server.err)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 3000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=body, headers=auth(), timeout=httpx.Timeout(30, read=1.0))
    m = server.wait_for(
        r"499 · blocking .* client disconnected after (\d+) steps \(the loop ran (\d+) more\)", start=mark
    )
    assert int(m.group(2)) <= 1 and int(m.group(1)) + int(m.group(2)) < 3000


@pytest.fixture(scope="module")
def one_at_a_time() -> Any:
    """`--parallel 1 --queue 1`: one generation at a time, the others wait their turn (the loop
    before continuous batching; the module's server runs the default, --parallel 4)."""
    with Serve("--queue", "1", "--parallel", "1", env={"LOOPCHAT_API_KEY": KEY}) as s:
        yield s


def test_concurrent_requests_take_turns(one_at_a_time: Serve) -> None:
    client = one_at_a_time.client(KEY)
    spans: dict[int, tuple[float, float, int]] = {}
    barrier = threading.Barrier(2)

    def one(i: int) -> None:
        barrier.wait()
        times = []
        for chunk in client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=20, stream=True, extra_body={"ignore_eos": True}
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                times.append(time.perf_counter())
        spans[i] = (times[0], times[-1], len(times))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(spans) == [0, 1] and all(n >= 15 for _, _, n in spans.values())
    (a0, a1, _), (b0, b1, _) = sorted(spans.values())
    assert a1 < b0  # the second's first token came after the first's last: one loop, in turn


def test_over_the_queue_limit_is_429(one_at_a_time: Serve) -> None:
    server, client = one_at_a_time, one_at_a_time.client(KEY)
    stream = _long(client)  # runs
    next(iter(stream))
    waiting: dict[str, Any] = {}

    def second() -> None:
        waiting["reply"] = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)

    t = threading.Thread(target=second)
    t.start()
    deadline = time.monotonic() + 60  # nothing to await from outside: poll /health
    while httpx.get(server.url + "/health", timeout=30).json()["waiting"] < 1:
        assert time.monotonic() < deadline, "the second request never queued"
        time.sleep(0.02)
    with pytest.raises(openai.RateLimitError) as info:  # --queue 1: one waits, the third is refused
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
    assert info.value.code == "queue_full"
    stream.close()  # the first leaves: the second runs
    t.join(120)
    assert waiting["reply"].choices[0].finish_reason == "length"


def test_each_request_logs_one_line(server: Serve, client: OpenAI) -> None:
    mark = len(server.err)
    client.completions.create(model=MODEL, prompt=DOCUMENT, max_tokens=4, stream=True).close()
    client.completions.create(model=MODEL, prompt=DOCUMENT, max_tokens=4)
    m = server.wait_for(
        r"POST /v1/completions 200 · blocking · prompt \d+ tok · .*TTFT \d+ ms · 4 tok · .* tok/s .*finish: length",
        start=mark,
    )
    assert m


# ---- shutting down, starting up ----------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_shut_down_cleanly(sig: signal.Signals) -> None:
    s = Serve()
    try:
        stream = _long(s.client(key=None))
        got = [c for _, c in zip(range(3), stream)]
        assert len(got) == 3
        s.proc.send_signal(sig)
        rest = list(stream)  # the reply in progress ends (cancelled): its finish chunk, [DONE]
        assert rest and rest[-1].choices[0].finish_reason == "stop"
        # loopchat's own record says why (the chat showed "stopped (cancelled)", as if Esc)
        finish = rest[-1].model_extra["loopchat"]["finish"]
        assert finish["reason"] == "cancelled" and finish["error"] == "the server was stopped during this reply"
        assert s.proc.wait(30) == 0
        s.wait_for(rf"stopped \({sig.name}\).*the model is closed")
        assert not any("Traceback" in line for line in s.err + s.out)
        assert any("finish: cancelled" in line for line in s.err)
    finally:
        s.stop()


def _start_fails(*args: str) -> list[str]:
    proc = subprocess.run([PY, "-m", "loopchat", "serve", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("loopchat: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines


def test_bad_start_up_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert "pick another --port" in _start_fails("--port", port)[0]
    assert "port number" in _start_fails("--port", "99999")[0]
    assert "--queue" in _start_fails("--queue", "-1")[0]
    assert "/nowhere/model.gguf" in _start_fails("--port", "0", "--model", "/nowhere/model.gguf")[0]
    bad = tmp_path / "models.toml"
    bad.write_text("[models\n")
    assert "models.toml" in _start_fails("--port", "0", "--config", str(bad))[0]


def test_the_readme_example_runs_against_the_server(server: Serve) -> None:
    """The README's OpenAI-client example, as printed (only the address and key differ)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(from openai import OpenAI\n.*?)```", readme, re.S).group(1)
    assert 'base_url="http://127.0.0.1:8000/v1"' in code and "stream=True" in code
    code = code.replace("http://127.0.0.1:8000/v1", server.url + "/v1").replace('api_key="unused"', f'api_key="{KEY}"')
    mark = len(server.err)
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) >= 5  # the reply's words, streamed
    server.wait_for(r"POST /v1/chat/completions 200 · stream", start=mark)
