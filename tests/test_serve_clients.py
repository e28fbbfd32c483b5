"""`loopchat serve` as OpenAI's tutorial clients and browsers expect (issue 22, 1 and 5).

Real servers in child processes (serve_process.Serve): one as it starts by default,
one with --strict-model and --cors-origin. OpenAI's two tutorial snippets
(tests/clients/) run unchanged as their own processes, with only OPENAI_BASE_URL and
OPENAI_API_KEY in their environment; the Node one needs `node` and the `openai` package
that `make test` installs into tests/clients/node_modules (skipped, saying so, without).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from serve_process import (
    CLIENTS,
    FILE_STEM,
    KEY,
    NODE_MISSING,
    PY,
    SERVED,
    Serve,
    auth,
    node_json,
    reference_text,
    run_snippet,
    tiny_server,
)

from loopchat.backends.remote import RemoteBackend
from loopchat.events import Message, ModelReady, RunDone, Start
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings

pytestmark = [pytest.mark.model, pytest.mark.server]

TUTORIAL_MESSAGES = [{"role": "user", "content": "Say this is a test"}]  # the snippets' own
MESSAGES = [{"role": "user", "content": "Name a colour."}]
LOCAL_PAGE = "http://localhost:5173"
OTHER_PAGE = "https://app.example"


def _serve(tmp_path_factory: pytest.TempPathFactory, *args: str) -> Serve:
    return tiny_server(tmp_path_factory.mktemp("serve-clients"), *args)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    with _serve(tmp_path_factory) as s:
        yield s


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    with _serve(tmp_path_factory, "--strict-model", "--cors-origin", OTHER_PAGE) as s:
        yield s


# ---- 1. OpenAI's tutorial code, unchanged ----------------------------------------------


def test_openai_s_python_tutorial_runs_unchanged(server: Serve) -> None:
    printed = run_snippet(server, [PY, str(CLIENTS / "tutorial_stream.py")])
    assert printed and printed == reference_text(server, TUTORIAL_MESSAGES)


@pytest.mark.skipif(NODE_MISSING is not None, reason=NODE_MISSING or "")
def test_openai_s_node_tutorial_runs_unchanged(server: Serve) -> None:
    node = shutil.which("node")
    assert node is not None
    printed = run_snippet(server, [node, str(CLIENTS / "tutorial_stream.mjs")])
    assert printed and printed == reference_text(server, TUTORIAL_MESSAGES)


def test_any_model_name_is_answered_by_the_one_served(server: Serve) -> None:
    client = server.client(KEY)
    stream = client.chat.completions.create(model="gpt-4", messages=MESSAGES, max_tokens=8, stream=True)
    chunks = list(stream)
    assert chunks and {c.model for c in chunks} == {SERVED}  # which model really answered
    for name in ("", "gpt-4o-mini", FILE_STEM):
        reply = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=4)
        assert reply.model == SERVED and reply.choices[0].message.content
    assert client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Hi", max_tokens=2).model == SERVED
    r = httpx.post(
        server.url + "/v1/chat/completions", headers=auth(), timeout=120, json={"messages": MESSAGES, "max_tokens": 2}
    )  # no model at all
    assert r.status_code == 200 and r.json()["model"] == SERVED
    # the list says what is served; asking for another by name is still a 404
    assert [m.id for m in client.models.list().data] == [SERVED]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_strict_model_keeps_the_404_naming_the_served_one(strict: Serve) -> None:
    client = strict.client(KEY)
    for name in ("gpt-4o", ""):
        with pytest.raises(openai.NotFoundError) as info:
            client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=4)
        assert info.value.code == "model_not_found" and SERVED in info.value.message
    # the entry's name and the model file's name are accepted
    assert client.completions.create(model=SERVED, prompt="Hi", max_tokens=2).model == SERVED
    assert client.completions.create(model=FILE_STEM, prompt="Hi", max_tokens=2).model == SERVED


def test_each_request_is_named_in_its_header_and_its_log_line(server: Serve) -> None:
    """OpenAI's SDKs show the `x-request-id` header (openai-python's `_request_id`, its README's
    example, and an error's `request_id`): every response carries one, a new one each request,
    streamed ones included, and the server's log line for that request ends with it."""
    client = server.client(KEY)
    mark = len(server.err)
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=4)
    rid = reply._request_id
    assert rid and re.fullmatch(r"req_[0-9a-f]{24}", rid), rid
    server.wait_for(rf"POST /v1/chat/completions 200 · blocking · .* · {rid}$", start=mark)
    stream = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=4, stream=True)
    streamed = stream.response.headers.get("x-request-id")
    assert list(stream) and streamed and streamed != rid
    server.wait_for(rf"POST /v1/chat/completions 200 · stream · .* · {streamed}$", start=mark)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, logprobs=True, top_logprobs=30)
    failed = info.value.request_id
    assert failed and failed not in (rid, streamed)
    server.wait_for(rf"POST /v1/chat/completions 400 · .*top_logprobs.* · {failed}$", start=mark)
    assert httpx.get(server.url + "/health", timeout=30).headers["x-request-id"].startswith("req_")


@pytest.mark.skipif(NODE_MISSING is not None, reason=NODE_MISSING or "")
def test_the_node_sdk_reads_the_request_ids(server: Serve) -> None:
    mark = len(server.err)
    got = node_json(server, "request_id.mjs")
    assert got["reply"] and got["error"] and got["reply"] != got["error"], got
    server.wait_for(rf"POST /v1/chat/completions 200 · blocking · .* · {got['reply']}$", start=mark)
    server.wait_for(rf"POST /v1/chat/completions 400 · .* · {got['error']}$", start=mark)


# ---- 5. seeds, the extension's prompt, context overflow, CORS ----------------------------


def _start(reply: Any) -> dict[str, Any]:
    return reply.model_extra["loopchat"]["events"][0]


def test_seeds_beyond_32_bits_and_minus_one_are_taken(server: Serve) -> None:
    client = server.client(KEY)
    kw: dict[str, Any] = dict(
        model=SERVED, messages=MESSAGES, max_tokens=12, temperature=1.0, extra_body={"cache_prompt": False}
    )
    small = client.chat.completions.create(seed=5, **kw)
    assert _start(small)["settings"]["seed"] == 5 and _start(small)["seed_requested"] is None
    for big in (2**40 + 5, 2**64 - 2**32 + 5, -(2**63) + 5):  # the same low 32 bits: the same draws
        reply = client.chat.completions.create(seed=big, **kw)
        start = _start(reply)
        assert start["settings"]["seed"] == 5 and start["seed_requested"] == big
        assert reply.choices[0].message.content == small.choices[0].message.content
    minus_two = _start(client.chat.completions.create(seed=-2, **kw))
    assert minus_two["settings"]["seed"] == 2**32 - 2
    random = _start(client.chat.completions.create(seed=-1, **kw))  # llama.cpp's "random"
    assert random["seed_requested"] == -1 and 0 <= random["settings"]["seed"] < 2**32
    for bad in (2**64, -(2**63) - 1, 1.5, "7"):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(seed=bad, **kw)  # type: ignore[arg-type]
        assert info.value.param == "seed" and "low 32 bits" in info.value.message


#: the long message's words, ~3.6 tokens each: 720 tokens, the asked chunk 12.7x the plain
#: one (300 words were a prefill of ~1,120 tokens, most of this module's server's CPU)
LONG_WORDS = 200


def _first_chunk(server: Serve, **extra: Any) -> tuple[dict[str, Any], int]:
    """The first chunk of a streamed reply to a long message, and the stream's bytes."""
    long = " ".join(f"word{i}" for i in range(LONG_WORDS))
    body = {"messages": [{"role": "user", "content": long}], "max_tokens": 2, "stream": True, **extra}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=auth(), timeout=120) as r:
        assert r.status_code == 200
        raw = r.read()
    first = raw.split(b"\n\n")[0]
    assert first.startswith(b"data: ")
    return json.loads(first[len(b"data: ") :]), len(raw)


def test_the_prompt_is_in_the_extension_only_when_asked_for(server: Serve) -> None:
    plain, plain_bytes = _first_chunk(server)
    start = plain["loopchat"]["start"]
    assert start["prompt_token_ids"] is None and start["prompt_text"] is None and start["messages"] == []
    assert start["prompt_token_texts"] == [] and start["n_ctx"] and start["settings"]["seed"] == 7
    asked, asked_bytes = _first_chunk(server, loopchat={"prompt": True})
    full = asked["loopchat"]["start"]
    assert len(full["prompt_token_ids"]) > 300 and f"word{LONG_WORDS - 1}" in full["prompt_text"]
    assert full["messages"][0]["role"] == "user" and len(full["prompt_token_texts"]) == len(full["prompt_token_ids"])
    assert len(json.dumps(plain)) * 10 < len(json.dumps(asked))  # the prompt was the bulk of it
    assert plain_bytes < asked_bytes
    for bad in ({"prompt": "yes"}, {"prompts": True}, "all"):
        r = httpx.post(
            server.url + "/v1/chat/completions",
            headers=auth(),
            timeout=60,
            json={"messages": MESSAGES, "loopchat": bad},
        )
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("loopchat"), r.text


def test_context_overflow_is_openai_s_context_length_exceeded(server: Serve) -> None:
    client = server.client(KEY)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=SERVED, messages=[{"role": "user", "content": "word " * 5000}], stream=True
        )
    assert info.value.code == "context_length_exceeded" and info.value.param == "messages"
    assert "too long for the context" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=SERVED, prompt="word " * 5000, max_tokens=2)
    assert info.value.code == "context_length_exceeded" and info.value.param == "prompt"


def _preflight(server: Serve, origin: str) -> httpx.Response:
    return httpx.options(
        server.url + "/v1/chat/completions",
        timeout=30,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
        },
    )


def test_a_browser_page_on_this_machine_may_call_by_default(server: Serve) -> None:
    pre = _preflight(server, LOCAL_PAGE)
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == LOCAL_PAGE
    assert "POST" in pre.headers["access-control-allow-methods"]
    assert "x-stainless-os" in pre.headers["access-control-allow-headers"].lower()
    body = {"messages": MESSAGES, "max_tokens": 3, "stream": True}
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        json=body,
        timeout=120,
        headers=auth(Origin="http://127.0.0.1:8080"),
    ) as r:
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://127.0.0.1:8080"
        assert r.read().endswith(b"data: [DONE]\n\n")


def test_a_page_from_elsewhere_is_refused_before_anything_runs(server: Serve) -> None:
    pre = _preflight(server, OTHER_PAGE)
    assert pre.status_code == 403 and "access-control-allow-origin" not in pre.headers
    assert "--cors-origin https://app.example" in pre.json()["error"]["message"]
    # a POST that needs no preflight (text/plain) does not start a generation either
    mark = len(server.err)
    r = httpx.post(
        server.url + "/v1/chat/completions",
        timeout=30,
        content=json.dumps({"messages": MESSAGES}),
        headers=auth(Origin=OTHER_PAGE, **{"Content-Type": "text/plain"}),
    )
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    line = server.wait_for(r"POST /v1/chat/completions (\d+)", start=mark)
    assert line.group(1) == "403"


def test_cors_origin_names_the_pages_that_may_call(strict: Serve) -> None:
    pre = _preflight(strict, OTHER_PAGE)
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == OTHER_PAGE
    assert _preflight(strict, LOCAL_PAGE).status_code == 403  # named origins replace the default
    # clients that are not browsers send no Origin: unaffected
    assert strict.client(KEY).models.list().data[0].id == SERVED


def test_a_bad_cors_origin_is_one_line_and_exit_2() -> None:
    done = subprocess.run(
        [PY, "-m", "loopchat", "serve", "--cors-origin", "localhost:3000"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert done.returncode == 2 and "scheme://host[:port]" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_loopchat_client_without_extensions_still_records_its_messages(server: Serve) -> None:
    """`extensions = false` sends no `loopchat` key: the server's start record comes
    without the prompt, and the client's Start keeps the messages it sent."""
    backend = RemoteBackend(server.url, api_key=KEY, extensions=False)
    events: queue.Queue = queue.Queue()
    backend.attach(events.put)
    sent = (Message("user", "Name a colour."),)
    try:
        backend.start()
        while not isinstance(events.get(timeout=60), ModelReady):
            pass
        backend.generate(ReplyRequest(sent, SamplingSettings(seed=3, max_tokens=4)))
        got = []
        while not isinstance(ev := events.get(timeout=120), RunDone):
            got.append(ev)
    finally:
        backend.close()
    start = next(e for e in got if isinstance(e, Start))
    assert start.source == server.url + "/v1" and start.n_ctx  # the server's own record
    assert start.messages == sent and start.prompt_token_ids is None and start.prompt_text is None
