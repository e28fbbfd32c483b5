"""OpenAI's Responses API on the wire (`POST /v1/responses`): one generation's events as the
response object, or as its stream of typed events.

The OpenAI SDKs' first example is `client.responses.create(model=..., input=...)` and
`response.output_text`; streamed, `for event in stream: if event.type ==
"response.output_text.delta": ...`. A reply is one output item, a message with one
`output_text` part. The stream is OpenAI's sequence of events, each an SSE `event:` line and
its JSON (`type` and `sequence_number` in every one): `response.created`,
`response.in_progress`, `response.output_item.added`, `response.content_part.added`, a
`response.output_text.delta` per token that releases text, `response.output_text.done`,
`response.content_part.done`, `response.output_item.done`, then `response.completed` (or
`response.incomplete`, reason `max_output_tokens`, where max_output_tokens cut the reply). A
reply that fails after the stream started ends with an `error` event and `response.failed`. The
stream ends with its last event (no `data: [DONE]`, which the chat endpoints send).

With function tools (serve/tools.py, wire_tools.py) the reply is read back as it is written:
an answer is the message item as above (its text decoded from the reply's JSON), tool calls are
`function_call` items (`call_id`, `name`, `arguments` as JSON text), each sent whole at the end:
`response.output_item.added`, `response.function_call_arguments.delta` and `.done`,
`response.output_item.done`. The message item's events wait until the reply says which it is.

loopchat's extension rides as in chat chunks: with `loopchat` on (the default), each delta
event carries the `loopchat` object of the events since the previous one (start, prefill,
the step), and the finished response the list of every event (`loopchat.events`).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from loopchat.event_json import to_json_dict
from loopchat.events import Event, Finish, FinishReason, Prefill, Start, Step
from loopchat.serve.response_store import output_messages
from loopchat.wire import EXTENSION_KEY, WireOptions, error_body, start_record, token_logprob
from loopchat.wire_tools import ToolReply

#: where a finished response goes to be kept: (its id, its output as chat messages, its object)
Keep = Callable[[str, tuple[dict[str, Any], ...], dict[str, Any]], None]


def event_line(obj: dict[str, Any]) -> str:
    """One Responses stream event as SSE: its type on the `event:` line, its JSON as data."""
    return f"event: {obj['type']}\ndata: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


class ResponsesSerializer:
    """`feed(event)`: the stream events that event makes (none, one or several); `lines(event)`
    the same as SSE text; after the Finish, `body()` is the response object and `done` is True
    (`error` set where the reply failed: `body()` is then OpenAI's error shape)."""

    def __init__(
        self,
        model: str,
        options: WireOptions,
        *,
        created: int | None = None,
        keep: Keep | None = None,
        conversation: str | None = None,
    ) -> None:
        self.model, self.options, self.conversation = model, options, conversation
        self.id, self.item_id = f"resp_{secrets.token_hex(24)}", f"msg_{secrets.token_hex(24)}"  # (OpenAI's shape)
        self.created = int(time.time()) if created is None else created
        self.done = False
        self.error: str | None = None
        self._seq = 0
        self._text: list[str] = []
        self._pending: dict[str, Any] = {}  # extension items waiting for the next delta
        self._events: list[dict[str, Any]] = []  # every event, for the body's extension
        self._finish: Finish | None = None
        self._prefill: Prefill | None = None
        self._tools = ToolReply() if options.tools else None
        self._opened = False  # the message item's added events sent
        self._calls: list[dict[str, Any]] = []  # the function_call items, at the end
        self._keep = keep  # (serve/response_store.py: the finished response, for previous_response_id)
        #: include's output text logprobs: every token's (the part's), and those the next delta carries
        self._logprobs: list[dict[str, Any]] | None = [] if options.logprobs and not options.tools else None
        self._lp_next: list[dict[str, Any]] = []

    def lines(self, event: Event) -> list[str]:
        return [event_line(e) for e in self.feed(event)]

    def feed(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, Start):  # (as the chat's chunks carry it)
            event = start_record(event, self.options)
        data: Any = to_json_dict(event) if self.options.extension else None
        if data is not None:
            if not self.options.stream:
                self._events.append(data)
            self._pending[data["kind"]] = data
        if isinstance(event, Start):
            return [
                self._event("response.created", response=self._response("in_progress")),
                self._event("response.in_progress", response=self._response("in_progress")),
                *(self._open() if self._tools is None else []),
            ]
        if isinstance(event, Prefill):
            self._prefill = event
        if isinstance(event, Step) and self._logprobs is not None and not event.is_stop:
            entry = token_logprob(event, self.options.top_logprobs)
            self._logprobs.append(entry)
            self._lp_next.append(entry)
        if isinstance(event, Step) and event.text:
            tools, text = self._tools, event.text
            out = []
            if tools is not None:
                text = tools.feed(text)
                if tools.form == "response" and not self._opened:
                    out = self._open()
            if text:
                self._text.append(text)
                lp, self._lp_next = self._lp_next, []
                out.append(
                    self._extend(self._event("response.output_text.delta", **self._where(), delta=text, logprobs=lp))
                )
            return out
        if isinstance(event, Finish):
            return self._finished(event)
        return []

    def _finished(self, finish: Finish) -> list[dict[str, Any]]:
        self.done, self._finish = True, finish
        if finish.reason is FinishReason.ERROR:
            self.error = finish.error or "generation failed"
            return [
                self._event("error", code="generation_error", message=self.error, param=None),
                self._event("response.failed", response=self._response("failed")),
            ]
        calls = self._tools.calls() if self._tools is not None else None
        if calls is not None:  # (the response's output from here on)
            self._calls = [_call_item(call) for call in calls]
        text, status = "".join(self._text), _status(finish)
        if self._keep is not None:  # (before the events: a client may continue it as soon as it is done)
            self._keep(self.id, output_messages(text, calls), self._response(status))
        if calls is not None:
            return self._called(status)
        return [
            *(self._open() if not self._opened else []),
            self._extend(
                self._event("response.output_text.done", **self._where(), text=text, logprobs=self._logprobs or [])
            ),
            self._event("response.content_part.done", **self._where(), part=_part(text, self._logprobs)),
            self._event("response.output_item.done", output_index=0, item=self._item(_item_status(status), text)),
            self._event(f"response.{status}", response=self._response(status)),
        ]

    def _open(self) -> list[dict[str, Any]]:
        """The message item's added events (with tools: once the reply is an answer)."""
        self._opened = True
        return [
            self._event("response.output_item.added", output_index=0, item=self._item("in_progress", None)),
            self._event("response.content_part.added", **self._where(), part=_part("")),
        ]

    def _called(self, status: str) -> list[dict[str, Any]]:
        """The reply's function_call items, each sent whole, then the response."""
        out = []
        for i, item in enumerate(self._calls):
            where = {"item_id": item["id"], "output_index": i}
            out += [
                self._event(
                    "response.output_item.added",
                    output_index=i,
                    item={**item, "arguments": "", "status": "in_progress"},
                ),
                self._event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
                self._event("response.function_call_arguments.done", **where, arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=i, item=item),
            ]
        out[0] = self._extend(out[0])
        return [*out, self._event(f"response.{status}", response=self._response(status))]

    def body(self) -> dict[str, Any]:
        """The response object, after the Finish (OpenAI's error shape where the reply failed)."""
        if self._finish is None:
            raise RuntimeError("body() before the generation finished")
        if self.error is not None:
            return error_body(self.error, "server_error", code="generation_error")
        obj = self._response(_status(self._finish))
        if self.options.extension:
            obj[EXTENSION_KEY] = {"events": self._events}
        return obj

    # ---- the objects ------------------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        obj = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return obj

    def _extend(self, obj: dict[str, Any]) -> dict[str, Any]:
        """`obj` with the `loopchat` records of the events since the last one that carried them."""
        if self._pending:
            obj[EXTENSION_KEY], self._pending = self._pending, {}
        return obj

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "output_index": 0, "content_index": 0}

    def _item(self, status: str, text: str | None) -> dict[str, Any]:
        content = [] if text is None else [_part(text, self._logprobs)]
        return {"id": self.item_id, "type": "message", "status": status, "role": "assistant", "content": content}

    def _response(self, status: str) -> dict[str, Any]:
        finish = self._finish
        output: list[dict[str, Any]] = [] if finish is None or status == "failed" else list(self._calls)
        if finish is not None and status != "failed" and not self._calls:
            output = [self._item(_item_status(status), "".join(self._text))]
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            "error": {"code": "server_error", "message": self.error} if self.error is not None else None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "parallel_tool_calls": False,
            "tool_choice": "none",
            "tools": [],
            "usage": self._usage(finish) if finish is not None and status != "failed" else None,
            **({"conversation": {"id": self.conversation}} if self.conversation is not None else {}),
        }

    def _usage(self, finish: Finish) -> dict[str, Any]:
        prompt, completion = finish.prompt_tokens or 0, finish.completion_tokens or 0
        cached = self._prefill.reused_tokens if self._prefill is not None else 0
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }


def _call_item(call: dict[str, Any]) -> dict[str, Any]:
    """A chat tool call (wire_tools.py) as the Responses API's function_call item."""
    fn = call["function"]
    item = {"id": f"fc_{secrets.token_hex(24)}", "type": "function_call", "status": "completed"}
    item.update({"arguments": fn["arguments"], "call_id": call["id"], "name": fn["name"]})
    return item


def _part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def _item_status(status: str) -> str:
    """The message item's status: incomplete in a response cut by max_output_tokens, as OpenAI's."""
    return "incomplete" if status == "incomplete" else "completed"


def _status(finish: Finish) -> str:
    """completed, or incomplete where max_output_tokens cut the reply."""
    return "incomplete" if finish.reason is FinishReason.LENGTH else "completed"


__all__ = ["ResponsesSerializer", "event_line"]
