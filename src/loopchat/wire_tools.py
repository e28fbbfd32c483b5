"""A reply to a request with tools (serve/tools.py), read back as OpenAI's message.

The reply is one JSON object, `{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}` or
`{"response": "..."}` (its constraint sees to that). `ToolReply.feed` takes the reply's text
token by token and gives back the response's text as far as it is decoded (JSON's escapes
undone; nothing of the tool-calls form); `calls()` at the end: the tool calls in OpenAI's
shape (an id each, the arguments as JSON text), or None for a response, or a reply cut before
its JSON closed.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

#: the object's opening and its one key (the whitespace the grammar may allow between them)
_HEAD = re.compile(r'\s*\{\s*"(tool_calls|response)"\s*:\s*')
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}


class ToolReply:
    def __init__(self) -> None:
        self.raw = ""
        self.form: str | None = None  # "tool_calls" | "response", once its key is written
        self.content: list[str] = []  # the response's text released so far
        self._at = -1  # raw's next character inside the response's string (-1: not opened yet)
        self._closed = False
        self._calls: list[dict[str, Any]] | None = None

    def feed(self, text: str) -> str:
        """`text` (a token's) added: the response's text it completes ("" for none)."""
        self.raw += text
        if self.form is None:
            head = _HEAD.match(self.raw)
            if head is None:
                return ""
            self.form, self._at = head.group(1), -head.end() - 1  # (-(where the value starts) - 1)
        if self.form != "response" or self._closed:
            return ""
        if self._at < 0:  # the string's opening quote
            start = -self._at - 1
            rest = self.raw[start:].lstrip()
            if not rest:
                return ""
            self._at = len(self.raw) - len(rest) + 1
        out = self._decode()
        self.content.append(out)
        return out

    def _decode(self) -> str:
        raw, i, out = self.raw, self._at, []
        while i < len(raw):
            c = raw[i]
            if c == '"':
                self._closed = True
                i += 1
                break
            if c != "\\":
                out.append(c)
                i += 1
                continue
            if i + 1 >= len(raw):
                break
            e = raw[i + 1]
            if e != "u":
                out.append(_ESCAPES.get(e, e))
                i += 2
                continue
            if i + 6 > len(raw):
                break
            code = int(raw[i + 2 : i + 6], 16)
            if 0xD800 <= code < 0xDC00:  # a surrogate pair: both halves, or wait for the second
                if i + 12 > len(raw):
                    break
                code = 0x10000 + ((code - 0xD800) << 10) + (int(raw[i + 8 : i + 12], 16) - 0xDC00)
                i += 6
            out.append(chr(code))
            i += 6
        self._at = i
        return "".join(out)

    def calls(self) -> list[dict[str, Any]] | None:
        """The tool calls in OpenAI's shape, or None (a response, or JSON cut before a call closed);
        a reply cut after some calls closed: those."""
        if self.form != "tool_calls" or self._calls is not None:
            return self._calls
        try:
            written = json.loads(self.raw)["tool_calls"]
        except (json.JSONDecodeError, KeyError, TypeError):
            written = _whole_calls(self.raw)  # (cut by max_tokens: the calls it finished)
            if not written:
                return None
        self._calls = [
            {
                "id": "call_" + secrets.token_hex(12),
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
            }
            for c in written
        ]
        return self._calls

    @property
    def text(self) -> str:
        """The message's content: the response's text (the tool-calls form has none)."""
        return "".join(self.content)


def _whole_calls(raw: str) -> list[dict[str, Any]]:
    """The call objects a tool-calls reply cut short had closed, in order."""
    start = raw.find("[")
    if start < 0:
        return []
    decoder, at = json.JSONDecoder(), start + 1
    out: list[dict[str, Any]] = []
    while True:
        while at < len(raw) and raw[at] in " \t\n\r,":
            at += 1
        try:
            call, at = decoder.raw_decode(raw, at)
        except json.JSONDecodeError:
            return out
        if isinstance(call, dict) and "name" in call and "arguments" in call:
            out.append(call)


def tool_finish(reason: str, calls: list[dict[str, Any]] | None) -> str:
    """OpenAI's finish_reason: "tool_calls" for a reply that ended with its calls (one cut by
    max_tokens stays "length")."""
    return "tool_calls" if calls and reason == "stop" else reason


def tool_delta(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """A stream's delta with the tool calls, whole (OpenAI's clients add up a call's pieces by index)."""
    return {"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}


def tool_message(text: str, calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The body's message: the content, or the tool calls (content null)."""
    if calls:
        return {"role": "assistant", "content": None, "refusal": None, "tool_calls": calls}
    return {"role": "assistant", "content": text, "refusal": None}
