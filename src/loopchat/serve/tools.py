"""OpenAI's tool calling on `loopchat serve` (`tools`, `tool_choice`, `parallel_tool_calls`, and
a conversation's tool calls and tool results), as llama.cpp's server does it for a chat template
with no tool format of its own ("generic"): the tools are described in a system message, and
the reply is constrained (llguidance, a JSON schema: the constraint stage in every step) to one
JSON object, `{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}` to call tools or
`{"response": "..."}` to answer ("auto"; "required" or one named function: the first form
alone, and only that function). serve/tool_reply.py turns the reply back into OpenAI's message:
`tool_calls` with ids and JSON-text arguments (finish reason "tool_calls"), or the response's
text as the content, streamed as it is written.

Earlier turns go into the prompt as the model would have written them: an assistant message's
tool calls as that JSON object, a tool result as a user message `{"tool_result": {"name": ...,
"tool_call_id": ..., "content": ...}}`. `tool_choice: "none"` sends no tools (the conversation's
earlier calls are still rendered).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from loopchat.constraint import Constraint
from loopchat.events import Message

#: OpenAI's rule for a function's name
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: a function without `parameters` takes none (OpenAI's "an empty parameter list"): `{}` alone
_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


class ToolProblem(ValueError):
    """A request's tools, tool_choice or tool messages that cannot be used: the message and the parameter."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolChoice:
    """The tools the reply may call, and whether it must call one."""

    tools: tuple[Tool, ...]
    required: bool  # "required" or a named function: no {"response": ...} form
    parallel: bool  # parallel_tool_calls (default true): more than one call in a reply

    def schema(self) -> dict[str, Any]:
        """The JSON schema the reply follows."""
        call = [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in self.tools
        ]
        calls: dict[str, Any] = {"type": "array", "items": call[0] if len(call) == 1 else {"anyOf": call}}
        calls.update({"minItems": 1} if self.parallel else {"minItems": 1, "maxItems": 1})
        form: dict[str, Any] = {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"]}
        form["additionalProperties"] = False
        if self.required:
            return form
        answer: dict[str, Any] = {"type": "object", "properties": {"response": {"type": "string"}}}
        answer.update({"required": ["response"], "additionalProperties": False})
        return {"anyOf": [form, answer]}

    def constraint(self) -> Constraint:
        return Constraint("json_schema", json.dumps(self.schema()), "tools")

    def system_text(self) -> str:
        """What the model is told of the tools and of the form of its reply."""
        listed = json.dumps(
            [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in self.tools]
        )
        call = '{"tool_calls": [{"name": "<a tool\'s name>", "arguments": {<its arguments>}}]}'
        how = f"Reply with one JSON object: {call}" + (
            "." if self.required else ' to call tools, or {"response": "<your answer>"} to answer the user.'
        )
        return f"You can call these tools, each given with the JSON schema of its arguments:\n{listed}\n{how}"


def _tool(value: Any, i: int) -> Tool:
    where = f"tools[{i}]"
    fn = value.get("function") if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(fn, dict):
        raise ToolProblem(
            f'{where} must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}', where
        )
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ToolProblem(f"{where}.function.name must be 1 to 64 letters, digits, _ or -, got {name!r}", where)
    params = fn.get("parameters", _NO_PARAMETERS)
    if not isinstance(params, dict):
        raise ToolProblem(f"{where}.function.parameters must be a JSON schema object", where)
    description = fn.get("description") or ""
    return Tool(name, description if isinstance(description, str) else str(description), params)


def tool_choice(body: dict[str, Any]) -> ToolChoice | None:
    """The tools the reply may call (None: none: no tools, or tool_choice "none"); ToolProblem."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools in (None, []):
        if choice not in (None, "none", "auto"):
            raise ToolProblem(
                f"tool_choice {json.dumps(choice)} needs tools: send the tools it may call", "tool_choice"
            )
        return None
    if not isinstance(tools, list):
        raise ToolProblem('tools must be a list of {"type": "function", "function": {...}} objects', "tools")
    listed = tuple(_tool(t, i) for i, t in enumerate(tools))
    if len({t.name for t in listed}) < len(listed):
        raise ToolProblem("tools holds two functions of the same name: give each its own", "tools")
    parallel = body.get("parallel_tool_calls")
    parallel = True if parallel is None else bool(parallel)
    if choice in (None, "auto"):
        return ToolChoice(listed, False, parallel)
    if choice == "none":
        return None
    if choice == "required":
        return ToolChoice(listed, True, parallel)
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    named = [t for t in listed if t.name == name]
    if not named:
        raise ToolProblem(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}} '
            f"naming one of the tools, got {json.dumps(choice)}",
            "tool_choice",
        )
    return ToolChoice(tuple(named), True, parallel)


def with_tools(messages: tuple[Message, ...], choice: ToolChoice) -> tuple[Message, ...]:
    """The conversation with the tools' system text: after the system message's, or as the first message."""
    text = choice.system_text()
    if messages and messages[0].role == "system":
        return (Message("system", f"{messages[0].content}\n\n{text}"), *messages[1:])
    return (Message("system", text), *messages)


def call_message(m: dict[str, Any], where: str) -> tuple[Message, dict[str, str]]:
    """An assistant message with tool_calls, as the JSON the model writes (and its calls' names by id)."""
    calls, names = [], {}
    for j, call in enumerate(m.get("tool_calls") or ()):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ToolProblem(
                f'{where}.tool_calls[{j}] must be {{"id": ..., "function": {{"name": ..., "arguments": ...}}}}', where
            )
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else (args or {})
        except json.JSONDecodeError:
            raise ToolProblem(f"{where}.tool_calls[{j}].function.arguments must be JSON text", where) from None
        calls.append({"name": fn["name"], "arguments": args})
        if isinstance(call.get("id"), str):
            names[call["id"]] = fn["name"]
    return Message("assistant", json.dumps({"tool_calls": calls}, ensure_ascii=False)), names


def result_message(m: dict[str, Any], content: str, names: dict[str, str]) -> Message:
    """A tool's result (role "tool"), as the user message the model reads."""
    call_id = m.get("tool_call_id")
    result = {"name": names.get(call_id, m.get("name", "")) if isinstance(call_id, str) else m.get("name", "")}
    result.update({"tool_call_id": call_id, "content": content})
    return Message("user", json.dumps({"tool_result": result}, ensure_ascii=False))
