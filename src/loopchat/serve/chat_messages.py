"""A chat request's `messages` (requests.py's parse_chat): OpenAI's message objects as the engine's
Messages. The roles system, developer (read as system), user and assistant; an assistant's tool
calls and the tool messages with their results (serve/tools.py); content as a string, null, or a
list of text parts (joined by newlines). Anything else is a RequestError naming the message."""

from __future__ import annotations

from typing import Any

from loopchat.events import Message
from loopchat.serve.request_error import RequestError
from loopchat.serve.tools import ToolProblem, call_message, result_message

CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def chat_messages(value: Any) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value:
        raise RequestError(
            'messages must be a non-empty list of {"role": ..., "content": ...} objects', param="messages"
        )
    out: list[Message] = []
    names: dict[str, str] = {}  # the tool calls' names by id, for their results
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f'{where} must be an object {{"role": ..., "content": ...}}', param=where)
        role = m.get("role")
        if role == "function" or m.get("function_call"):
            raise RequestError(
                f"{where}: OpenAI's older function messages: send tool calls and tool messages", param=where
            )
        if role == "assistant" and m.get("tool_calls"):  # (serve/tools.py: as the model writes them)
            message, named = tool_read(call_message, m, where)
            names.update(named)
            out.append(message)
            continue
        if role == "tool":
            out.append(tool_read(result_message, m, _content(m.get("content"), f"{where}.content"), names))
            continue
        if role not in CHAT_ROLES:
            raise RequestError(
                f"{where}.role must be one of system, developer, user, assistant; got {role!r}", param=f"{where}.role"
            )
        out.append(Message(CHAT_ROLES[role], _content(m.get("content"), f"{where}.content")))
    return tuple(out)


def tool_read(read: Any, *args: Any) -> Any:
    """serve/tools.py's `read(*args)`, its ToolProblem as the request's 400."""
    try:
        return read(*args)
    except ToolProblem as exc:
        raise RequestError(str(exc), param=exc.param) from None


def _content(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(
                    f'{where}: only text content is supported (parts of type "text"), got {kind!r}', param=where
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise RequestError(f"{where} must be a string or a list of text parts", param=where)
