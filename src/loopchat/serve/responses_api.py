"""`POST /v1/responses` (OpenAI's Responses API): its body read as the chat request it asks for.

`input` (a string: one user message; or a list of messages, `{"role", "content"}` with the
content a string or a list of `input_text` / `output_text` parts), `instructions` (a system
message before them), `max_output_tokens`, `temperature`, `top_p`, `stream`, and
`text.format` (`{"type": "json_schema", "name", "schema", "strict"}` or `{"type":
"json_object"}`: the reply follows it, as `response_format` does on the chat endpoint) become
the chat request `requests.parse_chat` reads, with loopchat's own keys (top_k, seed, the
`loopchat` extension, ...) passed through. Function tools (`tools` of type "function",
`tool_choice`, `parallel_tool_calls`, and `function_call` / `function_call_output` items in
`input`) become the chat's tools, tool calls and tool messages (serve/tools.py).
`previous_response_id` continues a response the server kept (serve/response_store.py: its
conversation comes before `input`; its instructions do not, as OpenAI's), a 404 for one it
has not; `store: false` keeps this one out. `conversation` continues one of OpenAI's
Conversations API (serve/conversations.py: its items before `input`; this request's input and
output added to it). What the server cannot do is one line, a 400: other tools (web search,
files, ...), parts that are not text, `n`. `include: ["message.output_text.logprobs"]` and
`top_logprobs` are the chat's `logprobs` and `top_logprobs`. `metadata`, `user`, `truncation`,
`service_tier` and `reasoning` are taken and change nothing (the model does not reason).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from loopchat.serve.conversations import ConversationStore, binding, is_text_part, items_of
from loopchat.serve.request_error import RequestError
from loopchat.serve.requests import GenerationRequest, parse_chat
from loopchat.serve.response_store import KEEP, ResponseStore
from loopchat.settings import SamplingSettings

#: keys of a Responses body that have no chat counterpart and change nothing here
_TAKEN = ("store", "metadata", "user", "truncation", "service_tier", "reasoning", "include")  # (store: the caller's)
#: keys of a Responses body read here, not passed on as chat keys
_READ = (
    "input",
    "instructions",
    "max_output_tokens",
    "text",
    "previous_response_id",
    "conversation",
    "prompt",
    "tools",
    "tool_choice",
    "top_logprobs",
)


def parse_responses(
    body: dict[str, Any],
    base: SamplingSettings,
    store: ResponseStore | None = None,
    conversations: ConversationStore | None = None,
) -> GenerationRequest:
    """A /v1/responses body, as the chat request it asks for (RequestError: one line); with
    `store`, `previous_response_id` continues a response kept there, and the request's
    `conversation` is set for this one to be kept (unless the body says `store: false`); with
    `conversations`, the body's `conversation` is continued (the request's `thread`)."""
    thread = binding(body, conversations) if conversations is not None else None
    if thread is None and body.get("conversation") is not None:
        raise _refused("conversation", "conversation: this server keeps no conversations")
    earlier = _earlier(body.get("previous_response_id"), store) if thread is None else _messages(thread[1], True)
    if body.get("prompt") is not None:
        raise _refused(
            "prompt", "prompt (a stored prompt template) is not supported: send the text in input and instructions"
        )
    chat_tools = _tools(body.get("tools"))
    if body.get("n") not in (None, 1):
        raise _refused("n", "n is not a Responses API parameter: /v1/chat/completions writes n choices in one batch")
    logprobs = _logprobs(body.get("include"), body.get("top_logprobs"))
    chat = {k: v for k, v in body.items() if k not in _TAKEN and k not in _READ}
    if chat_tools:
        chat["tools"], chat["tool_choice"] = chat_tools, _tool_choice(body.get("tool_choice"))
    messages = [*earlier, *_messages(body.get("input"))]
    conversation = tuple(messages) if store is not None and body.get("store") is not False else None
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise RequestError("instructions must be a string (a system message)", param="instructions")
        messages.insert(0, {"role": "system", "content": instructions})
    chat["messages"] = messages
    if logprobs is not None:  # (the chat's logprobs: the raw softmax's, with its top N)
        chat["logprobs"], chat["top_logprobs"] = True, logprobs
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    fmt = _format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    try:
        request = parse_chat(chat, base)
        inputs = tuple(items_of(body.get("input"), "input"))
        return replace(request, conversation=conversation, inputs=inputs, thread=thread and thread[0])
    except RequestError as exc:  # (the chat's names for what the body calls otherwise)
        if exc.param == "max_tokens":
            exc.param, exc.message = "max_output_tokens", exc.message.replace("max_tokens", "max_output_tokens")
        raise


#: what `include` may ask for: the output text's logprobs
_INCLUDE = "message.output_text.logprobs"


def _logprobs(include: Any, top: Any) -> int | None:
    """`include: ["message.output_text.logprobs"]` and `top_logprobs` (0-20): the top list's
    length (None: no logprobs)."""
    asked = include or []
    if not isinstance(asked, list) or any(item != _INCLUDE for item in asked):
        raise _refused(
            "include",
            f"include takes only {_INCLUDE!r} (got {include!r}): loopchat's own records come in the loopchat key",
        )
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
        raise RequestError(f"top_logprobs must be a whole number from 0 to 20, got {top!r}", param="top_logprobs")
    return None if not asked and top is None else (top or 0)


def _earlier(response_id: Any, store: ResponseStore | None) -> tuple[dict[str, Any], ...]:
    """The conversation a previous_response_id continues (() for none); a 404 for one not kept."""
    if response_id is None:
        return ()
    found = store.conversation(response_id) if store is not None and isinstance(response_id, str) else None
    if found is None:
        raise RequestError(
            f"previous response {response_id!r} is not kept here: this server keeps its latest {KEEP} responses "
            "in memory, not those stored with store: false or from before it started; send the whole "
            "conversation in input",
            status=404,
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return found


def _tools(value: Any) -> list[dict[str, Any]]:
    """The function tools, in the chat's shape ({"type": "function", "function": {...}})."""
    if value in (None, []):
        return []
    if not isinstance(value, list):
        raise RequestError(
            'tools must be a list of {"type": "function", "name": ..., "parameters": ...}', param="tools"
        )
    out = []
    for i, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        if kind != "function":
            raise _refused(f"tools[{i}]", f"tools[{i}]: only function tools are supported, got {kind!r}")
        out.append(
            {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters") if k in tool}}
        )
    return out


def _tool_choice(value: Any) -> Any:
    """tool_choice in the chat's shape (a named function: {"type": "function", "function": {"name": ...}})."""
    if isinstance(value, dict) and value.get("type") == "function":
        return {"type": "function", "function": {"name": value.get("name")}}
    return value


def _refused(key: str, message: str) -> RequestError:
    return RequestError(message, param=key, code="unsupported_parameter")


def _messages(value: Any, may_be_empty: bool = False) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not (value or may_be_empty):
        raise RequestError(
            'input must be a string or a non-empty list of {"role": ..., "content": ...} messages', param="input"
        )
    out: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else type(item).__name__
        if kind == "function_call":  # (the model's call, as the output held it: the chat's assistant tool call)
            call = {"id": item.get("call_id"), "type": "function"}
            call["function"] = {"name": item.get("name"), "arguments": item.get("arguments")}
            if out and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            continue
        if kind == "function_call_output":
            output = item.get("output")
            if isinstance(output, list):
                output = [_text_part(part, f"{where}.output[{j}]") for j, part in enumerate(output)]
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
            continue
        if kind != "message":
            raise RequestError(
                f"{where}: only messages, function calls and their outputs are supported, got {kind!r}", param=where
            )
        content = item.get("content")
        if isinstance(content, list):
            content = [_text_part(part, f"{where}.content[{j}]") for j, part in enumerate(content)]
        out.append({"role": item.get("role"), "content": content})
    return out


def _text_part(part: Any, where: str) -> dict[str, Any]:
    if not is_text_part(part):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        raise RequestError(f'{where}: only text is supported (parts of type "input_text"), got {kind!r}', param=where)
    return {"type": "text", "text": part["text"]}


def _format(text: Any) -> dict[str, Any] | None:
    """`text.format` as the chat's response_format (None: plain text)."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_schema", "json_object"):
        raise RequestError(
            'text.format must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "schema": {...}}',
            param="text.format",
        )
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}


__all__ = ["parse_responses"]
