"""`POST /v1/responses` on `loopchat serve`: OpenAI's Responses API, the SDKs' first example.

A real server in a child process (serve_process.Serve, the model's seed pinned in its
models.toml); OpenAI's quickstart snippets (tests/clients/tutorial_responses.*) run unchanged
as their own processes with only OPENAI_BASE_URL and OPENAI_API_KEY set; the Python SDK's
create, stream, parse and stream helper; the raw events and the `loopchat` extension; what
the server cannot do is a 400 in one line.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import httpx
import openai
import pytest
from pydantic import BaseModel
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

from loopchat.events import Finish, Start, Step
from loopchat.wire import extension_events

pytestmark = [pytest.mark.model, pytest.mark.server]

QUICKSTART = "Write a one-sentence bedtime story about a unicorn."  # the snippets' own input
STREAM_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
STREAM_END = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    with tiny_server(tmp_path_factory.mktemp("serve-responses")) as s:
        yield s


def _quickstart(server: Serve, argv: list[str]) -> str:
    """The quickstart snippet as its own process (a blocking POST /v1/responses); what it printed."""
    return run_snippet(server, argv, "/v1/responses", "blocking")


def test_openai_s_python_quickstart_runs_unchanged(server: Serve) -> None:
    printed = _quickstart(server, [PY, str(CLIENTS / "tutorial_responses.py")])
    expected = reference_text(server, [{"role": "user", "content": QUICKSTART}])
    assert printed.strip() and printed == expected + "\n"


@pytest.mark.skipif(NODE_MISSING is not None, reason=NODE_MISSING or "")
def test_openai_s_node_quickstart_runs_unchanged(server: Serve) -> None:
    printed = _quickstart(server, [shutil.which("node") or "node", str(CLIENTS / "tutorial_responses.mjs")])
    expected = reference_text(server, [{"role": "user", "content": QUICKSTART}])
    assert printed.strip() and printed == expected + "\n"


def test_a_stream_is_openai_s_events_in_order_and_its_text_the_reply(server: Serve) -> None:
    client = server.client(KEY)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    expected = reference_text(server, messages, seed=3, max_tokens=160)
    events = list(
        client.responses.create(
            model="gpt-5",
            instructions="Be brief.",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]}],
            stream=True,
            max_output_tokens=160,
            extra_body={"seed": 3, "cache_prompt": False},
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == STREAM_ORDER and kinds[-4:] == [*STREAM_END, "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == expected == final.output_text and final.status == "completed"
    assert events[-4].text == expected and final.usage.output_tokens > 0 and final.usage.input_tokens > 10
    # max_output_tokens: the reply cut, said as OpenAI says it
    cut = client.responses.create(model="m", input="Tell me a long story.", max_output_tokens=5, stream=True)
    last = list(cut)[-1]
    assert last.type == "response.incomplete" and last.response.status == "incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens" and last.response.usage.output_tokens == 5
    assert last.response.output[0].status == "incomplete" and last.response.id.startswith("resp_")
    # tool_choice "auto" (the API's default) with no tools: no tool is chosen, nothing to refuse
    assert client.responses.create(model="m", input="Hi", tool_choice="auto", max_output_tokens=2).output_text


class Cat(BaseModel):
    name: str
    age: int


def test_parse_and_the_stream_helper_return_what_the_sdk_promises(server: Serve) -> None:
    client = server.client(KEY)
    parsed = client.responses.parse(model="m", input="A cat as JSON.", text_format=Cat, max_output_tokens=60)
    assert isinstance(parsed.output_parsed, Cat) and parsed.status == "completed"
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "count", "schema": schema, "strict": True}
    shaped = client.responses.create(model="m", input="A number as JSON.", text={"format": fmt}, max_output_tokens=30)
    assert shaped.status == "completed" and set(json.loads(shaped.output_text)) == {"n"}
    cut = client.responses.create(
        model="m", input="Any JSON.", text={"format": {"type": "json_object"}}, max_output_tokens=3
    )
    assert cut.output_text.startswith("{") and cut.status == "incomplete"  # (a JSON object starts with its brace)
    with client.responses.stream(model="m", input="Count to three.", max_output_tokens=200) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas and "".join(deltas) == final.output_text


def test_the_loopchat_extension_rides_the_events_and_the_body(server: Serve) -> None:
    body = {"input": "Name a fruit.", "max_output_tokens": 8, "seed": 5 + 2**32}  # (drawn with 5, its low 32 bits)
    r = httpx.post(server.url + "/v1/responses", headers=auth(), timeout=120, json=body)
    assert r.status_code == 200, r.text
    obj = r.json()
    assert obj["object"] == "response" and obj["model"] == SERVED
    events = extension_events(obj)
    steps = [e for e in events if isinstance(e, Step)]
    finish = next(e for e in events if isinstance(e, Finish))
    text = obj["output"][0]["content"][0]["text"]
    assert "".join(s.text for s in steps) == text == finish.text and obj["usage"]["output_tokens"] == len(steps)
    start = next(e for e in events if isinstance(e, Start))  # as the chat's chunks carry it (wire.start_record)
    assert (start.settings.seed, start.seed_requested) == (5, 5 + 2**32)
    assert start.messages == () and start.prompt_special == () and start.model_path == f"{FILE_STEM}.gguf"
    # streamed: each delta carries the step that released its text
    with httpx.stream(
        "POST", server.url + "/v1/responses", headers=auth(), timeout=120, json={**body, "stream": True}
    ) as s:
        raw = s.read().decode()
    assert raw.endswith("\n\n") and "[DONE]" not in raw  # (OpenAI's Responses stream ends with its last event)
    blocks = [b for b in raw.split("\n\n") if b]
    assert all(b.startswith("event: ") for b in blocks)
    data = [json.loads(b.split("\ndata: ", 1)[1]) for b in blocks]
    assert all(b.split("\n", 1)[0] == f"event: {d['type']}" for b, d in zip(blocks, data, strict=True))
    deltas = [d for d in data if d["type"] == "response.output_text.delta"]
    assert deltas and all(d["loopchat"]["step"]["text"] == d["delta"] for d in deltas)
    assert "".join(d["delta"] for d in deltas) == text  # the same seed: the same reply


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"input": "Hi", "tools": [{"type": "file_search"}]}, "tools[0]", "only function tools"),
        ({"input": "Hi", "conversation": {"id": 5}}, "conversation", "a conversation id"),
        ({"input": "Hi", "conversation": "conv_1", "previous_response_id": "resp_1"}, "conversation", "together"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
            "only text",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]", "only messages, function calls"),
        ({"input": "Hi", "text": {"format": {"type": "xml"}}}, "text.format", '{"type": "json_schema"'),
        ({"input": "Hi", "include": ["reasoning.encrypted_content"]}, "include", "takes only"),
        ({"input": "Hi", "top_logprobs": 21}, "top_logprobs", "from 0 to 20"),
        ({"input": "Hi", "max_output_tokens": -1}, "max_output_tokens", "max_output_tokens"),
        ({}, "input", "input must be a string"),
    ],
)
def test_what_it_cannot_do_is_a_400_in_one_line(server: Serve, body: dict, param: str, says: str) -> None:
    r = httpx.post(server.url + "/v1/responses", headers=auth(), timeout=60, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"] and "\n" not in error["message"], error
    if body:  # the SDK raises it as OpenAI's own 400
        with pytest.raises(openai.BadRequestError) as info:
            server.client(KEY).responses.create(model="m", **body)
        assert info.value.status_code == 400 and says in info.value.message


def test_previous_response_id_continues_a_kept_response(server: Serve) -> None:
    """OpenAI's conversation-state guide: the second response reads the first's input and output
    (not its instructions, as OpenAI's); GET /v1/responses/{id} returns a kept response,
    DELETE forgets it; store: false keeps none; an id not kept is a 404 naming it."""
    client = server.client(KEY)
    first = client.responses.create(model="m", input="tell me a joke", instructions="Be brief.", max_output_tokens=20)
    second = client.responses.create(
        model="m",
        previous_response_id=first.id,
        input=[{"role": "user", "content": "explain why this is funny."}],
        max_output_tokens=10,
        extra_body={"loopchat": {"prompt": True}},
    )
    start = second.model_extra["loopchat"]["events"][0]
    said = [(m["role"], m["content"]) for m in start["messages"]]
    assert said[-3:] == [
        ("user", "tell me a joke"),
        ("assistant", first.output_text),
        ("user", "explain why this is funny."),
    ]
    assert all("Be brief." not in content for _, content in said)
    third = client.responses.create(
        model="m", previous_response_id=second.id, input="and another?", max_output_tokens=5
    )
    assert third.status in ("completed", "incomplete")  # (a chain of three)
    assert client.responses.retrieve(first.id).output_text == first.output_text
    said = [(i.role, i.content[0].text) for i in client.responses.input_items.list(second.id)]
    assert said == [("user", "explain why this is funny.")]  # (its own input: not the one it continued)
    client.responses.delete(first.id)
    for gone in (first.id, "resp_nope"):
        with pytest.raises(openai.NotFoundError) as info:
            client.responses.create(model="m", previous_response_id=gone, input="hi")
        assert "is not kept here" in info.value.message
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(gone)
        with pytest.raises(openai.NotFoundError):
            client.responses.input_items.list(gone)
    unkept = client.responses.create(model="m", input="hi", store=False, max_output_tokens=3)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="m", previous_response_id=unkept.id, input="hi")


def test_a_function_call_continues_with_its_output_alone(server: Serve) -> None:
    """The function-calling guide's shorter form: the call's output sent with previous_response_id."""
    tool = {
        "type": "function",
        "name": "get_time",
        "description": "The time now.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    }
    client = server.client(KEY)
    first = client.responses.create(model="m", input="What time is it?", tools=[tool], tool_choice="required")
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and all(c.name == "get_time" and json.loads(c.arguments) == {} for c in calls)
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": "12:00"} for c in calls]
    second = client.responses.create(
        model="m",
        previous_response_id=first.id,
        input=outputs,
        tools=[tool],
        tool_choice="none",
        max_output_tokens=10,
        extra_body={"loopchat": {"prompt": True}},
    )
    messages = second.model_extra["loopchat"]["events"][0]["messages"]
    results = [m["content"] for m in messages[-len(calls) :]]  # each call's output, named by the kept call
    assert results == [
        f'{{"tool_result": {{"name": "get_time", "tool_call_id": "{c.call_id}", "content": "12:00"}}}}' for c in calls
    ]
    assert second.output[0].type == "message"


def test_the_output_text_s_logprobs_are_the_raw_softmax_s(server: Serve) -> None:
    """include: ["message.output_text.logprobs"] with top_logprobs: each token of the reply with its
    logprob, ln of the step record's raw probability, and its top N; streamed, the deltas' entries
    add up to the finished part's."""
    import math

    client = server.client(KEY)
    ask = {"model": "m", "input": "Name a fruit.", "include": ["message.output_text.logprobs"], "top_logprobs": 3}
    reply = client.responses.create(**ask, max_output_tokens=12)
    entries = reply.output[0].content[0].logprobs
    steps = [e for e in reply.model_extra["loopchat"]["events"] if e["kind"] == "step" and not e["is_stop"]]
    assert len(entries) == len(steps) == reply.usage.output_tokens
    for entry, step in zip(entries, steps, strict=True):
        assert entry.token == step["piece"] and entry.logprob == math.log(step["raw_prob"])
        assert [t.token for t in entry.top_logprobs] == [c[1] for c in step["raw_top"][:3]]
    streamed = list(client.responses.create(**ask, max_output_tokens=12, stream=True))
    deltas = [lp.token for e in streamed if e.type == "response.output_text.delta" for lp in e.logprobs]
    done = next(e for e in streamed if e.type == "response.output_text.done")
    assert deltas == [lp.token for lp in done.logprobs] and deltas


def _said(response) -> list[tuple[str, str]]:  # noqa: ANN001
    """The chat messages the reply read (the `loopchat` extension's start, asked with prompt: true)."""
    return [(m["role"], m["content"]) for m in response.model_extra["loopchat"]["events"][0]["messages"]]


def test_the_conversations_api_continues_and_keeps_a_conversation(server: Serve) -> None:
    """OpenAI's conversation-state guide, the Conversations API way: a conversation made with an
    item; each response with `conversation` reads its items before its input, names it, and adds its
    input and output to it; the items listed newest first (the default), oldest first, by pages;
    items added, read and deleted; metadata updated; a deleted conversation is a 404 naming it."""
    client = server.client(KEY)
    prompt = {"loopchat": {"prompt": True}}
    conv = client.conversations.create(metadata={"topic": "demo"}, items=[{"role": "user", "content": "Hello!"}])
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "demo"}
    first = client.responses.create(
        model="gpt-4.1",
        input=[{"role": "user", "content": "What are the 5 Ds of dodgeball?"}],
        conversation=conv.id,
        max_output_tokens=12,
        extra_body=prompt,
    )
    assert first.conversation is not None and first.conversation.id == conv.id
    assert _said(first) == [("user", "Hello!"), ("user", "What are the 5 Ds of dodgeball?")]
    second = client.responses.create(
        model="gpt-4.1",
        input="And the first one?",
        conversation={"id": conv.id},
        max_output_tokens=6,
        extra_body=prompt,
    )
    assert _said(second)[-2:] == [("assistant", first.output_text), ("user", "And the first one?")]
    items = list(client.conversations.items.list(conv.id))
    assert [(i.role, i.content[0].text) for i in items] == [
        ("assistant", second.output_text),
        ("user", "And the first one?"),
        ("assistant", first.output_text),
        ("user", "What are the 5 Ds of dodgeball?"),
        ("user", "Hello!"),
    ]
    assert items[2].id == first.output[0].id and len({i.id for i in items}) == 5
    # the response's own input items (GET /v1/responses/{id}/input_items): the same items, ids and all
    assert [i.id for i in client.responses.input_items.list(first.id)] == [items[3].id]
    assert [i.content[0].text for i in client.responses.input_items.list(second.id)] == ["And the first one?"]
    page = client.conversations.items.list(conv.id, order="asc", limit=2)
    assert [i.id for i in page.data] == [i.id for i in items[::-1][:2]] and page.has_more
    assert [i.id for i in page.get_next_page().data] == [i.id for i in items[::-1][2:4]]
    added = client.conversations.items.create(conv.id, items=[{"type": "message", "role": "user", "content": "Hm"}])
    item_id = added.data[0].id
    assert client.conversations.items.retrieve(item_id, conversation_id=conv.id).content[0].text == "Hm"
    client.conversations.items.delete(item_id, conversation_id=conv.id)
    assert len(client.conversations.items.list(conv.id).data) == 5
    assert client.conversations.update(conv.id, metadata={"topic": "x"}).metadata == {"topic": "x"}
    assert client.conversations.retrieve(conv.id).metadata == {"topic": "x"}
    assert client.conversations.delete(conv.id).deleted
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="m", input="hi", conversation=conv.id)
    assert info.value.code == "conversation_not_found" and "is not kept here" in info.value.message
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.list(conv.id)


def test_a_streamed_response_and_a_bad_item_in_a_conversation(server: Serve) -> None:
    """A streamed response in a conversation: its last event's response names it, and its input
    and output are added; an item of a kind the server cannot read is a 400 naming it."""
    client = server.client(KEY)
    conv = client.conversations.create()
    events = list(client.responses.create(model="m", input="Say hi", conversation=conv.id, stream=True))
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete") and last.response.conversation.id == conv.id
    items = client.conversations.items.list(conv.id, order="asc").data
    assert [i.role for i in items] == ["user", "assistant"] and items[0].content[0].text == "Say hi"
    assert items[1].content[0].text == last.response.output[0].content[0].text
    with pytest.raises(openai.BadRequestError) as info:
        client.conversations.items.create(conv.id, items=[{"type": "reasoning", "summary": []}])
    assert info.value.param == "items[0]" and "only messages" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:  # (refused when added, not when a response reads it)
        client.conversations.items.create(
            conv.id, items=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]
        )
    assert info.value.param == "items[0]" and "text parts" in info.value.message
    with pytest.raises(openai.BadRequestError):
        client.conversations.items.list(conv.id, limit=500)


@pytest.mark.skipif(NODE_MISSING is not None, reason=NODE_MISSING or "")
def test_the_node_sdk_continues_a_conversation(server: Serve) -> None:
    got = node_json(server, "conversations.mjs")
    assert got["conversation"].startswith("conv_") and got["named"] == got["conversation"]
    assert got["roles"] == ["user", "user", "assistant", "user", "assistant"], got
