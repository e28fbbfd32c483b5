"""`loopchat serve` with OpenAI's `n` > 1 (issue 25, item 2): n choices written in one batch,
through the official `openai` client; each choice with its index, its own logprobs and its own
`loopchat` extension records (the session's shared server, conftest.py's queue_one_server)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from openai import OpenAI
from serve_process import KEY, Serve

pytestmark = [pytest.mark.model, pytest.mark.server]

MESSAGES = [{"role": "user", "content": "Name an animal."}]


@pytest.fixture(scope="module")
def client(queue_one_server: Serve) -> OpenAI:
    return queue_one_server.client(KEY)


def test_stream_n_choices_each_with_its_index_logprobs_and_steps(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model="m", messages=MESSAGES, n=3, max_tokens=10, temperature=1.0, seed=5, stream=True,
        logprobs=True, top_logprobs=2, stream_options={"include_usage": True},
    )  # fmt: skip
    text: dict[int, str] = {0: "", 1: "", 2: ""}
    logprobs: dict[int, list[Any]] = {0: [], 1: [], 2: []}
    steps: dict[int, list[dict]] = {0: [], 1: [], 2: []}
    finished, usage = set(), None
    for chunk in stream:
        ext = (chunk.model_extra or {}).get("loopchat") or {}
        if not chunk.choices:
            usage = chunk.usage
            continue
        assert len(chunk.choices) == 1
        choice = chunk.choices[0]
        j = choice.index
        text[j] += choice.delta.content or ""
        if choice.logprobs is not None:
            logprobs[j].extend(choice.logprobs.content)
        if "step" in ext:
            assert ext["step"]["sequence"] == j  # a choice's records are its own sequence's
            steps[j].append(ext["step"])
        if "start" in ext:
            assert ext["start"]["sequence"] == j and ext["start"]["sequences"] == 3
            assert ext["start"]["settings"]["seed"] == 5 + j
        if choice.finish_reason is not None:
            finished.add(j)
    assert finished == {0, 1, 2} and all(text.values())
    for j in range(3):
        assert "".join(e.token for e in logprobs[j]) == text[j]
        shown = [s for s in steps[j] if not s["is_stop"]]
        assert [e.token for e in logprobs[j]] == [s["piece"] for s in shown]
        for entry, step in zip(logprobs[j], shown):
            assert entry.logprob == pytest.approx(math.log(step["raw_prob"]), abs=1e-6)
            assert len(entry.top_logprobs) == 2
        assert all(s["batch"][1] >= 1 for s in steps[j][1:])  # [number, size, ms, single_ms]
    assert usage is not None and usage.completion_tokens == sum(len(logprobs[j]) for j in range(3))


@pytest.mark.parametrize("n", [2, 4])
def test_blocking_chat_and_completions_give_n_choices(client: OpenAI, n: int) -> None:
    reply = client.chat.completions.create(
        model="m", messages=MESSAGES, n=n, max_tokens=8, temperature=1.0, seed=1, logprobs=True
    )
    assert [c.index for c in reply.choices] == list(range(n))
    for c in reply.choices:
        assert c.message.content and "".join(e.token for e in c.logprobs.content) == c.message.content
    events = (reply.model_extra or {})["loopchat"]["events"]
    assert sorted(e["sequence"] for e in events if e["kind"] == "finish") == list(range(n))
    assert reply.usage.completion_tokens == sum(len(c.logprobs.content) for c in reply.choices)
    done = client.completions.create(model="m", prompt="The sea is", n=n, max_tokens=6, temperature=1.0, logprobs=1)
    assert [c.index for c in done.choices] == list(range(n))
    assert all(c.text and len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) for c in done.choices)
