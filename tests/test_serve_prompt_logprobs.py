"""`loopchat serve` sends the prompt's logprobs (issue 26, part 2): the legacy completions'
`echo` + `logprobs`, as OpenAI's completions API did, and chat's prefill record in the
`loopchat` extension on request. A real server (conftest's queue_one_server), the official
`openai` client, the real default model."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI
from serve_process import KEY, Serve

from loopchat.engine.engine import Engine
from loopchat.events import DOCUMENT, Message, Prefill, Start
from loopchat.settings import SamplingSettings
from loopchat.wire import extension_events

pytestmark = [pytest.mark.model, pytest.mark.server]

MODEL = "smollm2-135m-instruct"
PROMPT = "Once upon a time, in a small village by the sea, there lived"


@pytest.fixture(scope="module")
def client(queue_one_server: Serve) -> OpenAI:
    return queue_one_server.client(KEY)


def _direct(model_path: Path, tmp_path: Path, messages: tuple[Message, ...], k: int) -> tuple[Start, Prefill]:
    with Engine(model_path, n_ctx=2048, threads=1, log_path=tmp_path / "llama.log") as engine:
        events = list(engine.generate(messages, SamplingSettings(seed=1, max_tokens=1), prompt_logprobs=k))
    return next(e for e in events if isinstance(e, Start)), next(e for e in events if isinstance(e, Prefill))


def test_echo_and_logprobs_give_the_prompt_s_tokens_as_the_model_read_them(
    client: OpenAI, model_path: Path, tmp_path: Path
) -> None:
    kw: dict[str, Any] = dict(model=MODEL, prompt=PROMPT, max_tokens=4, seed=3, echo=True, logprobs=3)
    body = client.completions.create(**kw, extra_body={"cache_prompt": False})
    choice = body.choices[0]
    start, prefill = _direct(model_path, tmp_path, (Message(DOCUMENT, PROMPT),), 3)
    n = len(start.prompt_token_ids)
    lp = choice.logprobs
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    assert "".join(lp.tokens[:n]) == PROMPT and lp.text_offset[:n] == [
        sum(len(t) for t in lp.tokens[:i]) for i in range(n)
    ]
    assert lp.text_offset[n] == len(PROMPT)  # the completion's offsets count from the prompt's end
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for i in range(1, n):
        assert lp.token_logprobs[i] == pytest.approx(prefill.prompt_logprobs[i], abs=1e-4 * math.log(2))
        guesses = {c.text: math.log(c.prob) for c in prefill.prompt_top[i]}
        assert set(guesses) <= set(lp.top_logprobs[i]) and lp.tokens[i] in lp.top_logprobs[i]
    assert len(lp.tokens) == n + body.usage.completion_tokens


def test_echo_streams_the_prompt_first_then_the_same_completion(client: OpenAI) -> None:
    kw: dict[str, Any] = dict(model=MODEL, prompt=PROMPT, max_tokens=6, seed=5, echo=True)
    whole = client.completions.create(**kw, extra_body={"cache_prompt": False}).choices[0].text
    chunks = [c for c in client.completions.create(**kw, stream=True, extra_body={"cache_prompt": False}) if c.choices]
    assert chunks[0].choices[0].text == PROMPT
    assert "".join(c.choices[0].text for c in chunks) == whole


def test_chat_sends_the_prompt_logprobs_in_the_extension_on_request(client: OpenAI) -> None:
    messages = [{"role": "user", "content": "What is the capital of Germany?"}]
    extra = {"loopchat": {"prompt": True, "prompt_logprobs": 2}, "cache_prompt": False}
    body = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, extra_body=extra)
    events = extension_events(body.to_dict())
    start = next(e for e in events if isinstance(e, Start))
    prefill = next(e for e in events if isinstance(e, Prefill))
    assert len(prefill.prompt_logprobs) == len(start.prompt_token_ids) == len(prefill.prompt_top)
    assert prefill.prompt_logprobs[0] is None and all(len(t) == 2 for t in prefill.prompt_top[1:])
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert next(e for e in extension_events(plain.to_dict()) if isinstance(e, Prefill)).prompt_logprobs is None


@pytest.mark.parametrize(
    "call, needle, param",
    [
        ("chat", "echo is for /v1/completions", "echo"),
        ("ext", "loopchat.prompt_logprobs must be from 0 to 20", "loopchat.prompt_logprobs"),
    ],
)
def test_bad_requests_are_400(client: OpenAI, call: str, needle: str, param: str) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError) as info:
        if call == "chat":
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, extra_body={"echo": True})
        else:
            extra = {"loopchat": {"prompt_logprobs": 21}}
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, extra_body=extra)
    assert needle in info.value.message and info.value.param == param


@pytest.mark.parametrize("stream", [True, False])
def test_loopchat_s_own_client_asks_for_them_and_reads_them(queue_one_server: Serve, stream: bool) -> None:
    import queue

    from loopchat.backends.remote import RemoteBackend
    from loopchat.events import ModelReady, RunDone
    from loopchat.request import ReplyRequest

    backend = RemoteBackend(queue_one_server.url, api_key=KEY)
    q: queue.Queue = queue.Queue()
    backend.attach(q.put)
    try:
        backend.start()
        while not isinstance(q.get(timeout=30), ModelReady):
            pass
        request = ReplyRequest((Message("user", "Hi there"),), SamplingSettings(seed=1, max_tokens=2), stream=stream)
        backend.generate(request.with_(prompt_logprobs=1))
        events = []
        while not isinstance(ev := q.get(timeout=60), RunDone):
            events.append(ev)
    finally:
        backend.close()
    start = next(e for e in events if isinstance(e, Start))
    prefill = next(e for e in events if isinstance(e, Prefill))
    assert len(prefill.prompt_logprobs) == len(start.prompt_token_ids) and prefill.prompt_logprobs[0] is None
    assert all(len(t) == 1 for t in prefill.prompt_top[1:])
