"""/v1/completions with a list of prompts (serve/prompt_list.py): OpenAI's cookbook example of
batching requests ("How to handle rate limits": one request, a list of prompts, each choice's
index says whose) with OpenAI's Python SDK on real servers. With --parallel 1 the runs go one
after another, so each prompt's text is exactly the one a request of its own gets with the same
seed; with the default --parallel 4 they share passes, and the extension says which prompt each
choice continued."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from openai import OpenAI
from serve_process import KEY, Serve

from loopchat.serve.prompt_list import MAX_PROMPTS

pytestmark = [pytest.mark.model, pytest.mark.server]

PROMPTS = ["Once upon a time,", "The recipe for bread is", "In the year 2050,", "My favourite animal is"]


@pytest.fixture(scope="module")
def one_by_one_server() -> Iterator[Serve]:
    with Serve("--parallel", "1", env={"LOOPCHAT_API_KEY": KEY}) as s:
        yield s


@pytest.fixture(scope="module")
def one_by_one(one_by_one_server: Serve) -> OpenAI:
    return one_by_one_server.client(KEY)


@pytest.fixture(scope="module")
def shared(queue_one_server: Serve) -> OpenAI:
    return queue_one_server.client(KEY)


def test_the_cookbook_s_batched_prompts_come_back_by_index(one_by_one: OpenAI) -> None:
    got = one_by_one.completions.create(model="gpt-3.5-turbo-instruct", prompt=PROMPTS, max_tokens=12, seed=7)
    stories = [""] * len(PROMPTS)
    for choice in got.choices:  # (the cookbook's loop)
        stories[choice.index] = PROMPTS[choice.index] + choice.text
    assert sorted(c.index for c in got.choices) == [0, 1, 2, 3]
    alone = [one_by_one.completions.create(model="m", prompt=p, max_tokens=12, seed=7) for p in PROMPTS]
    assert stories == [p + a.choices[0].text for p, a in zip(PROMPTS, alone)]
    assert got.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert got.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)


def test_a_stream_interleaves_the_prompts_under_one_id(one_by_one: OpenAI) -> None:
    texts: dict[int, str] = {}
    ids, usages = set(), []
    stream = one_by_one.completions.create(
        model="m", prompt=PROMPTS[:2], max_tokens=10, seed=3, stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        ids.add(chunk.id)
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
        if chunk.usage is not None:
            usages.append(chunk.usage)
    alone = [one_by_one.completions.create(model="m", prompt=p, max_tokens=10, seed=3) for p in PROMPTS[:2]]
    assert texts == {i: a.choices[0].text for i, a in enumerate(alone)}
    assert len(ids) == 1 and len(usages) == 1  # one response; one usage chunk, the runs' added up
    assert usages[0].completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert usages[0].prompt_tokens == sum(a.usage.prompt_tokens for a in alone)


def test_n_choices_of_each_prompt_share_passes_and_say_whose_they_are(shared: OpenAI) -> None:
    """Three prompts, n=2, on --parallel 4: choices 2i and 2i+1 continue prompt i (its start
    record's prompt, under loopchat.prompts[i])."""
    got = shared.completions.create(
        model="m",
        prompt=PROMPTS[:3],
        n=2,
        max_tokens=6,
        seed=5,
        extra_body={"loopchat": {"prompt": True}, "ignore_eos": True},
    )
    assert [c.index for c in got.choices] == list(range(6))
    assert got.usage.completion_tokens == 6 * 6
    prompts = got.model_extra["loopchat"]["prompts"]
    assert len(prompts) == 3
    for i, ext in enumerate(prompts):
        start = ext["events"][0]
        assert start["kind"] == "start" and start["messages"][-1]["content"] == PROMPTS[i]


def test_a_prompt_the_engine_refuses_is_the_request_s_error_naming_it(shared: OpenAI) -> None:
    """A 400 while nothing was sent (blocking; a stream whose first prompt is refused); once a
    stream has begun, an error chunk (the SDK raises APIError) that names the prompt."""
    long = "word " * 5000
    for prompts, stream in ((["Hello", long], False), ([long, "Hello"], True)):
        with pytest.raises(openai.BadRequestError) as info:
            reply = shared.completions.create(model="m", prompt=prompts, max_tokens=4, stream=stream)
            list(reply) if stream else None
        i = prompts.index(long)
        assert info.value.param == f"prompt[{i}]" and f"400 - prompt[{i}]: the document is too long" in str(info.value)
    with pytest.raises(openai.APIError) as begun:  # (a 400 if the refusal came before prompt 0's first token)
        list(shared.completions.create(model="m", prompt=["Hello", long], max_tokens=40, stream=True))
    assert "prompt[1]: the document is too long" in str(begun.value)
    with pytest.raises(openai.BadRequestError) as info:
        shared.completions.create(model="m", prompt=["a"] * (MAX_PROMPTS + 1), max_tokens=1)
    assert f"at most {MAX_PROMPTS}" in info.value.message


def test_a_client_that_leaves_ends_the_runs_begun_and_begins_no_more(one_by_one_server: Serve) -> None:
    """Ten prompts on --parallel 1: the client leaves during the first; the second, waiting for the
    place, is cancelled as it gets it (0 steps), and the eight others never begin."""
    server, mark = one_by_one_server, len(one_by_one_server.err)
    body = {"prompt": ["Once upon a time"] * 10, "max_tokens": 2000, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, headers=headers, timeout=1.0)
    server.wait_for(r"499 · prompt 1 of 10 · blocking .* client disconnected after \d+ steps", start=mark)
    server.wait_for(
        r"499 · prompt 2 of 10 · blocking .*finish: cancelled · client disconnected after 0 steps", start=mark
    )
    after = server.client(KEY).completions.create(model="m", prompt="Hi", max_tokens=2, seed=1)
    assert after.choices[0].text  # the loop is free: the next request runs at once
    assert not any(
        "of 10" in line for line in server.err[mark:] if "prompt 1 of 10" not in line and "prompt 2 of 10" not in line
    )


def test_max_tokens_0_scores_each_prompt_and_writes_nothing(one_by_one_server: Serve, one_by_one: OpenAI) -> None:
    """OpenAI's old way to score a text, as lm-evaluation-harness's loglikelihood sends it: echo,
    logprobs and max_tokens 0, a list of prompts. Each choice is its prompt, scored token by token
    (the same logprobs a request that writes one token gets for its prompt), nothing after it."""
    texts = ["The capital of France is Paris", "The capital of France is London"]
    mark = len(one_by_one_server.err)
    got = one_by_one.completions.create(model="m", prompt=texts, echo=True, logprobs=1, max_tokens=0)
    # its log line: no first token's time nor rate where no token was written
    line = one_by_one_server.wait_for(r"200 · prompt 2 of 2 · blocking · .*", start=mark).group(0)
    assert " · 0 tok · " in line and "TTFT" not in line and "tok/s" not in line
    assert [c.text for c in got.choices] == texts and {c.finish_reason for c in got.choices} == {"length"}
    assert got.usage.completion_tokens == 0
    for text, choice in zip(texts, got.choices):
        alone = one_by_one.completions.create(model="m", prompt=text, echo=True, logprobs=1, max_tokens=1, seed=1)
        lp = alone.choices[0].logprobs
        k = len(choice.logprobs.tokens)
        assert choice.logprobs.tokens == lp.tokens[:k] and "".join(choice.logprobs.tokens) == text
        assert choice.logprobs.token_logprobs[0] is None
        assert choice.logprobs.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:k], abs=1e-4)
    paris, london = (c.logprobs.token_logprobs[-1] for c in got.choices)
    assert paris > london  # what the scores are for: the model finds " Paris" likelier there
    with pytest.raises(openai.BadRequestError) as info:
        one_by_one.completions.create(model="m", prompt="Hi", max_tokens=0, n=2)
    assert info.value.param == "n"
    with pytest.raises(openai.BadRequestError):  # (the chat endpoint writes at least one token)
        one_by_one.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=0)


def test_token_ids_are_a_prompt_as_their_text_is(one_by_one: OpenAI) -> None:
    """A prompt of token ids (what lm-evaluation-harness sends by default), and a list of them:
    the same reply, usage and scores as the text they spell; an id past the vocabulary, or a mix
    of forms, is a 400."""
    ids = [504, 3575, 282, 4649, 314]  # "The capital of France is", the default model's tokens
    by_ids = one_by_one.completions.create(model="m", prompt=ids, max_tokens=8, seed=3)
    by_text = one_by_one.completions.create(model="m", prompt="The capital of France is", max_tokens=8, seed=3)
    assert by_ids.choices[0].text == by_text.choices[0].text
    # (the same counts; how many prompt tokens the cache held depends on the request before)
    assert (by_ids.usage.prompt_tokens, by_ids.usage.completion_tokens) == (5, 8)
    assert (by_text.usage.prompt_tokens, by_text.usage.completion_tokens) == (5, 8)
    scored = one_by_one.completions.create(
        model="m", prompt=[[*ids, 7042], [*ids, 4528]], echo=True, logprobs=1, max_tokens=0
    )
    texts = [c.text for c in scored.choices]
    assert texts == ["The capital of France is Paris", "The capital of France is London"]
    as_text = one_by_one.completions.create(model="m", prompt=texts, echo=True, logprobs=1, max_tokens=0)
    for a, b in zip(scored.choices, as_text.choices):
        assert a.logprobs.tokens == b.logprobs.tokens
        assert a.logprobs.token_logprobs[1:] == pytest.approx(b.logprobs.token_logprobs[1:], abs=1e-6)
    for bad, words in (
        ([1, 2, 99_999], "prompt token 99999 is not in the model's vocabulary"),
        ([[1, 2], "a"], "not a mix"),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            one_by_one.completions.create(model="m", prompt=bad, max_tokens=2)
        assert words in info.value.message
