"""OpenAI's tool calling on `loopchat serve` (serve/tools.py, wire_tools.py): the tutorial's
function-calling round trip with OpenAI's Python SDK on a real server. The reply is constrained
to the tools' JSON form (each step's constraint figures say so), read back as `tool_calls` with
JSON arguments that follow the function's schema, or as content; streamed, the SDK's own
accumulation gives the same; the tool's result goes back in and the model answers."""

from __future__ import annotations

import json

import openai
import pytest
from openai import OpenAI
from serve_process import KEY, NODE_MISSING, Serve, node_json

from loopchat.wire_tools import ToolReply

pytestmark = [pytest.mark.model, pytest.mark.server]

MODEL = "smollm2-135m-instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now."}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def client(queue_one_server: Serve) -> OpenAI:
    return queue_one_server.client(KEY)


def _check_weather_call(call) -> dict:
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "unit"} and isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")
    return args


def test_the_function_calling_round_trip(client: OpenAI) -> None:
    """tool_choice "required": a call of the function, its arguments per its schema; then the
    tool's result in the conversation and an answer ("auto" may answer: here it must, "none")."""
    first = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", seed=1, max_tokens=100
    )
    choice = first.choices[0]
    calls = choice.message.tool_calls
    assert calls and all(c.function.name in ("get_weather", "get_time") for c in calls)
    # (parallel calls: a small model may write them to max_tokens; the calls it finished are kept)
    assert choice.finish_reason in ("tool_calls", "length") and choice.message.content is None
    steps = [e for e in first.model_extra["loopchat"]["events"] if e["kind"] == "step"]
    assert all(s["constraint"] for s in steps)  # the tools' form was the constraint at every pass
    messages = [*ASK, choice.message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": c.id, "content": '{"sky": "sunny", "celsius": 21}'} for c in calls]
    second = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER, TIME], tool_choice="none", seed=1, max_tokens=40
    )
    assert second.choices[0].message.content and second.choices[0].message.tool_calls is None
    # the tool's result went into the prompt, under the name of the call it answers
    start = second.model_extra["loopchat"]["events"][0]
    assert start["kind"] == "start"


def test_a_named_function_is_called_with_arguments_that_follow_its_schema(client: OpenAI) -> None:
    for seed in range(3):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=[WEATHER, TIME],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False,
            seed=seed,
            max_tokens=100,
        )
        calls = reply.choices[0].message.tool_calls
        assert reply.choices[0].finish_reason == "tool_calls" and len(calls) == 1
        _check_weather_call(calls[0])


def test_streamed_tool_calls_add_up_in_the_sdk(client: OpenAI) -> None:
    """The stream's chunks carry no JSON as content; the calls come whole in one delta before the
    finish reason, and the SDK's stream helper adds them up to the same message as a blocking reply."""
    ask = {
        "model": MODEL,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "seed": 2,
        "max_tokens": 100,
    }
    blocking = client.chat.completions.create(**ask).choices[0].message.tool_calls[0]
    chunks = list(client.chat.completions.create(**ask, stream=True))
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    with client.chat.completions.stream(**ask) as stream:
        final = stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls[0]
    assert _check_weather_call(streamed) == json.loads(blocking.function.arguments)


def test_auto_may_answer_and_the_answer_streams_as_content(client: OpenAI) -> None:
    """With tool_choice "auto" the reply is a call or an answer; an answer's text streams as content
    (its JSON string decoded), the same as the blocking reply's."""
    haiku = [{"role": "user", "content": "Write a haiku about the sea."}]  # (no call needed: it answers)
    ask = {"model": MODEL, "messages": haiku, "tools": [TIME], "max_tokens": 60}
    for seed in range(6):
        blocking = client.chat.completions.create(**ask, seed=seed).choices[0]
        if blocking.message.tool_calls is None and blocking.message.content:  # (not a call cut before it closed)
            break
    else:
        pytest.fail("six seeds, six tool calls: no answer to check")
    assert blocking.message.content is not None and not blocking.message.content.startswith("{")
    chunks = list(client.chat.completions.create(**ask, seed=seed, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == blocking.message.content


def test_a_function_without_parameters_is_called_with_none(client: OpenAI) -> None:
    """OpenAI: leaving out `parameters` defines a function with an empty parameter list (the
    model wrote {"": 1024, "time": ...} for it when any object was allowed)."""
    for seed in range(3):
        reply = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=[TIME], tool_choice="required", seed=seed, max_tokens=60
        )
        calls = reply.choices[0].message.tool_calls
        assert calls and all(json.loads(c.function.arguments) == {} for c in calls)


@pytest.mark.parametrize(
    "extra, needle, param",
    [
        ({"tool_choice": "required"}, "needs tools", "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "1 to 64 letters", "tools[0]"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "naming one",
            "tool_choice",
        ),
        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "both constrain", "tools"),
        ({"tools": [WEATHER], "n": 2}, "n = 1", "n"),
        ({"functions": [{"name": "f"}]}, "send the functions as tools", "functions"),
    ],
)
def test_bad_tools_are_a_400_naming_the_parameter(client: OpenAI, extra: dict, needle: str, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, **extra)
    assert needle in info.value.message and info.value.param == param


def test_the_reply_s_json_read_back() -> None:
    reply = ToolReply()
    text = json.dumps({"response": 'Hi "you"\nline \u00e9 \U0001f600 end'})
    assert (
        "".join(reply.feed(text[i : i + 3]) for i in range(0, len(text), 3)) == 'Hi "you"\nline \u00e9 \U0001f600 end'
    )
    assert reply.calls() is None
    reply = ToolReply()
    reply.feed('{"tool_calls": [{"name": "get_time", "arguments": {}}]}')
    (call,) = reply.calls()
    assert call["function"] == {"name": "get_time", "arguments": "{}"} and reply.calls()[0]["id"] == call["id"]
    cut = ToolReply()
    assert cut.feed('{"tool_calls": [{"name": "get_ti') == "" and cut.calls() is None  # cut before it closed
    cut = ToolReply()  # cut by max_tokens after a call closed: that call
    cut.feed('{"tool_calls": [{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"ci')
    assert [c["function"]["name"] for c in cut.calls()] == ["get_time"]


# ---- the Responses API's function tools (serve/responses_api.py, responses_wire.py) ------------

R_WEATHER = {
    "type": "function",
    "name": "get_weather",
    **{k: WEATHER["function"][k] for k in ("description", "parameters")},
}


def test_the_responses_api_s_function_calling_guide(client: OpenAI) -> None:
    """OpenAI's guide with client.responses: a function_call item, its output sent back as a
    function_call_output item with the call appended as the output gave it, and a second reply."""
    ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    first = client.responses.create(
        model=MODEL, input=ask, tools=[R_WEATHER], tool_choice="required", parallel_tool_calls=False
    )
    (call,) = first.output
    assert call.type == "function_call" and call.call_id.startswith("call_") and first.output_text == ""
    args = json.loads(call.arguments)
    assert call.name == "get_weather" and set(args) == {"city", "unit"}
    inputs = [*ask, call, {"type": "function_call_output", "call_id": call.call_id, "output": "21 degrees, sunny"}]
    second = client.responses.create(
        model=MODEL,
        input=inputs,
        tools=[R_WEATHER],
        tool_choice="none",
        max_output_tokens=30,
        extra_body={"loopchat": {"prompt": True}},
    )
    assert second.output[0].type == "message" and second.output_text
    prompt = second.model_extra["loopchat"]["events"][0]["prompt_text"]
    assert '"tool_result": {"name": "get_weather", "tool_call_id": "' + call.call_id in prompt
    assert '"arguments": ' + json.dumps(args) in prompt  # the call, as the model wrote it


def test_the_responses_api_streams_a_function_call_whole(client: OpenAI) -> None:
    ask = {
        "model": MODEL,
        "input": "Weather in Rome?",
        "tools": [R_WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": False,
    }
    kinds = [e.type for e in client.responses.create(**ask, stream=True)]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    with client.responses.stream(**ask) as stream:
        final = stream.get_final_response()
    (call,) = final.output
    assert call.type == "function_call" and set(json.loads(call.arguments)) == {"city", "unit"}


def test_the_responses_api_refuses_tools_it_has_not(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="Hi", tools=[{"type": "web_search_preview"}])
    assert "only function tools" in info.value.message and info.value.param == "tools[0]"


@pytest.mark.skipif(NODE_MISSING is not None, reason=NODE_MISSING or "")
def test_openai_s_node_sdk_calls_the_function(queue_one_server: Serve) -> None:
    """The guide with OpenAI's Node SDK (tests/clients/tutorial_tools.mjs): the blocking call and
    the stream helper's final completion each hold one call of get_weather, its strict
    arguments parsed (the helper fills parsed_arguments)."""
    printed = node_json(queue_one_server, "tutorial_tools.mjs")
    assert printed["finish"] == "tool_calls"
    for key in ("blocking", "streamed"):
        (call,) = printed[key]
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] == "get_weather"
        assert set(json.loads(call["function"]["arguments"])) == {"location"}
    assert printed["streamed"][0]["function"]["parsed_arguments"] == json.loads(
        printed["streamed"][0]["function"]["arguments"]
    )


def test_the_sdk_s_parse_with_a_pydantic_function_tool(client: OpenAI) -> None:
    """`chat.completions.parse(tools=[openai.pydantic_function_tool(Model)])`: the SDK checks the
    strict tool's arguments and gives them back as the model's object."""
    from pydantic import BaseModel

    class GetWeather(BaseModel):
        city: str
        country: str

    completion = client.chat.completions.parse(
        model=MODEL,
        messages=ASK,
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required",
        parallel_tool_calls=False,
        seed=1,
        max_tokens=60,
    )
    (call,) = completion.choices[0].message.tool_calls
    assert call.function.name == "GetWeather" and isinstance(call.function.parsed_arguments, GetWeather)
