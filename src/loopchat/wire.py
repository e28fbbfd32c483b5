"""The loop on the wire: a generation's events as OpenAI's HTTP bodies and SSE chunks.

One serializer, two users: `loopchat serve` sends what it returns, and the chat's wire
view shows, for a local engine, exactly what `loopchat serve` would send for the same
steps. It works from the events alone (events.py), so a recorded trace serializes the
same way as a live run.

Shapes (OpenAI's `ChatCompletionChunk`, `ChatCompletion`, `Completion`):
- chat stream: a first chunk with the role, one chunk per sampled token with its text
  (`delta.content`), a last chunk with `finish_reason` and an empty delta (or the text
  the stop token's step released: text held back for a stop string), then with
  `stream_options.include_usage` a chunk with `choices: []` and `usage`, then
  `data: [DONE]`;
- chat body: one `chat.completion` with the whole text and every token's logprobs;
- text completion (`/v1/completions`, the raw document): `text_completion` objects with
  `choices[0].text`, one per token when streaming, the legacy logprobs shape.

`logprobs` are OpenAI's: natural logarithms of the *raw* softmax (the model's logits,
before any sampling setting), the drawn token's and the top `top_logprobs` (at most 20).
The distribution actually sampled from, the timings and the settings in force travel
under one extension key, `loopchat` (OpenAI's clients keep unknown fields and ignore
them): the role chunk carries {"start": Start} (its prompt only when asked for:
`WireOptions.prompt`), each token's chunk {"step": Step} (and
{"prefill": ..., "context_trimmed": ...} before the first), the finish chunk the stop
token's step if one was drawn and {"finish": Finish}. Each is the event's trace form
(`event_json.to_json_dict`, docs/trace-format.md), so a loopchat client rebuilds the very
events the engine emitted: its panel is as complete as a local one.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

from loopchat.event_json import event_from_json_dict, to_json_dict
from loopchat.events import Candidate, ContextTrimmed, Event, Finish, FinishReason, Prefill, Start, Step
from loopchat.passes import PassReport
from loopchat.wire_echo import PromptEcho
from loopchat.wire_line import TokenLine
from loopchat.wire_tools import ToolReply, tool_delta, tool_finish, tool_message

#: The key of loopchat's own fields in a chunk or body.
EXTENSION_KEY = "loopchat"
#: OpenAI's limits on the number of top log-probabilities per token.
MAX_TOP_LOGPROBS = 20  # chat: `top_logprobs`
MAX_COMPLETION_LOGPROBS = 5  # legacy completions: `logprobs`
#: The logprob OpenAI gives a token whose probability is 0 (never -inf: JSON has none).
NO_LOGPROB = -9999.0
DONE_LINE = "data: [DONE]\n\n"

#: json.dumps(obj, ensure_ascii=False, separators=(",", ":")), the encoder made once, not per chunk;
#: without its check for circular references (a chunk is a tree of fresh dicts and lists: the same
#: text, ~4 of a step chunk's ~33 us with the extension: docs/performance.md, "The event loop's work
#: per chunk")
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode


def sse_line(obj: dict[str, Any]) -> str:
    """One server-sent event: `data: <compact JSON>` and the blank line that ends it."""
    return "data: " + _encode(obj) + "\n\n"


def logprob(p: float | None) -> float:
    """ln p; NO_LOGPROB for a probability of 0 or one not given (None)."""
    return math.log(p) if p is not None and p > 0.0 else NO_LOGPROB


def token_bytes(text: str) -> list[int] | None:
    """A token's UTF-8 bytes, or None when its text is not whole characters (a piece of
    a character split between tokens is shown as U+FFFD: its bytes are not known here)."""
    return None if "\ufffd" in text else list(text.encode("utf-8"))


def _step_bytes(step: Step) -> list[int] | None:
    return list(step.piece_bytes) if step.piece_bytes is not None else token_bytes(step.piece)


def finish_reason(reason: FinishReason) -> str:
    """OpenAI's finish_reason for loopchat's: the context window's end is a length end."""
    return "stop" if reason in (FinishReason.STOP, FinishReason.CANCELLED) else "length"


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


@dataclass(frozen=True)
class WireOptions:
    """What the request asked for."""

    chat: bool = True  # /v1/chat/completions (else /v1/completions)
    stream: bool = True
    logprobs: bool = False  # chat: logprobs=true; completions: logprobs=N > 0
    top_logprobs: int = 0  # chat: 0..20; completions: the N of logprobs=N (0..5)
    include_usage: bool = False  # stream_options.include_usage
    extension: bool = True  # add the `loopchat` extension objects
    prompt: bool = True  # the start record with the prompt (loopchat serve: only when asked)
    seed_requested: int | None = None  # the request's seed, when not used as given (-1, beyond 32 bits)
    echo: bool = False  # completions: the prompt first, and with logprobs its tokens' (wire_echo.py)
    prediction: bool = False  # a predicted output was given: usage says how many of its tokens were kept
    tools: bool = False  # the reply is serve/tools.py's JSON: read back as content or tool calls (wire_tools.py)


class WireSerializer:
    """Turns one generation's events into the chunks (or the body) of one response.

    `feed(event)` returns the chunk objects that event puts on the wire (none, one or
    two); `lines(event)` the same as SSE text. After the Finish, `body()` is the
    non-streaming response and `done` is True. A Finish with reason ERROR produces an
    `{"error": ...}` object instead of a finish chunk (OpenAI's clients raise it).
    """

    def __init__(
        self, model: str, options: WireOptions = WireOptions(), *, id: str | None = None, created: int | None = None
    ) -> None:
        self.model = model
        self.options = options
        self.id = id or new_id("chatcmpl" if options.chat else "cmpl")
        self.created = int(time.time()) if created is None else created
        self.done = False
        self.error: str | None = None
        self._pending: dict[str, Any] = {}  # extension items waiting for the next chunk
        self._text: list[str] = []
        self._logprobs: list[dict[str, Any]] = []  # chat entries (body)
        self._legacy: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        self._offset = 0  # characters of the completion so far (legacy text_offset)
        self._events: list[dict[str, Any]] = []  # every event, for the body's extension (stream=False only)
        self._finish: Finish | None = None
        self._prefill: Prefill | None = None
        self._tail = ""  # text released by the stop token's step: sent with the finish chunk
        self._echo: PromptEcho | None = None  # echo: the prompt, sent after the Prefill
        self._drafts = [0, 0, -1]  # drafted tokens kept, refused, the last verifying pass counted
        self._tools = ToolReply() if options.tools else None
        # a chat stream without the extension: its token chunks written straight as their lines
        # (wire_line.py: the same text, a token's chunk object neither built nor walked)
        self._line: TokenLine | None = None
        if options.chat and options.stream and not options.extension and not options.tools:
            head = self._base()
            self._line = TokenLine(
                _encode, head, options.top_logprobs, options.logprobs, options.include_usage, token_bytes, logprob
            )

    # ---- the stream -------------------------------------------------------------
    def lines(self, event: Event) -> list[str]:
        line = self._line
        if line is not None and type(event) is Step and not event.is_stop and not self._pending:
            # (_token_chunk's bookkeeping; a stream has no body, so no body's logprobs list)
            if event.pass_report is not None:
                self._tally(event.pass_report)
            self._advance(event.text)
            return [line.line(event)]
        return [sse_line(c) for c in self.feed(event)]

    def feed(self, event: Event) -> list[dict[str, Any]]:
        # the event's trace form, made once (it is the costliest part of a chunk); the
        # body's list of every event is kept only when there will be a body
        if isinstance(event, Start):
            if self.options.echo:
                self._echo = PromptEcho(event)
            event = start_record(event, self.options)
        data: Any = to_json_dict(event) if self.options.extension else None
        if data is not None and not self.options.stream:
            self._events.append(data)
        if isinstance(event, Start):
            if data is not None:
                self._pending["start"] = data
            if self.options.chat:
                return [self._chunk({"role": "assistant", "content": ""})]
            return []
        if isinstance(event, ContextTrimmed):
            if data is not None:
                self._pending["context_trimmed"] = data
            return []
        if isinstance(event, Prefill):
            self._prefill = event
            if data is not None:
                self._pending["prefill"] = data
            return self._echo_chunk(event) if self._echo is not None else []
        if isinstance(event, Step):
            if data is not None:
                self._pending["step"] = data
            if event.pass_report is not None:
                self._tally(event.pass_report)
            if event.is_stop:  # not part of the reply: it rides on the finish chunk
                # (with the text its step released, if any: the end of a character the
                # reply never finished, text held back for a stop string)
                self._tail = event.text
                self._text.append(event.text)
                return []
            return [self._token_chunk(event)]
        if isinstance(event, Finish):
            self.done = True
            self._finish = event
            if event.reason is FinishReason.ERROR:
                self.error = event.error or "generation failed"
                return [error_body(self.error, "server_error", code="generation_error")]
            if data is not None:
                self._pending["finish"] = data
            out = [self._finish_chunk(event)]
            if self.options.include_usage:
                out.append(self._usage_chunk(event))
            return out
        return []

    def _base(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.options.chat else "text_completion",
            "created": self.created,
            "model": self.model,
        }

    def _extend(self, obj: dict[str, Any]) -> dict[str, Any]:
        if self._pending:
            obj[EXTENSION_KEY] = self._pending
            self._pending = {}
        return obj

    def _chunk(self, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict[str, Any]:
        obj = self._base()
        if self.options.chat:
            obj["system_fingerprint"] = None
            obj["choices"] = [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
        else:
            obj["choices"] = [
                {"text": delta.get("content", ""), "index": 0, "logprobs": logprobs, "finish_reason": finish}
            ]
        if self.options.include_usage and self.options.stream:
            obj["usage"] = None
        return self._extend(obj)

    def _token_chunk(self, step: Step) -> dict[str, Any]:
        lp: Any = None
        if self.options.logprobs:
            if self.options.chat:
                entry = self._chat_logprob(step)
                self._logprobs.append(entry)
                lp = {"content": [entry], "refusal": None}
            else:
                lp = self._legacy_logprob(step)  # (its text_offset: the offset before this token)
        self._advance(step.text)
        if self._tools is not None:  # (the response's text as it is decoded; nothing of a tool call's JSON)
            return self._chunk({"content": text} if (text := self._tools.feed(step.text)) else {}, lp)
        return self._chunk({"content": step.text}, lp)

    def _advance(self, text: str) -> None:
        """A token's text is the reply's: kept for the body, the legacy text_offset moved past it."""
        self._text.append(text)
        self._offset += len(text)

    def _chat_logprob(self, step: Step) -> dict[str, Any]:
        return token_logprob(step, self.options.top_logprobs)

    def _legacy_logprob(self, step: Step) -> dict[str, Any]:
        n = self.options.top_logprobs
        top: dict[str, float] = {}
        for c in step.raw_top[:n]:
            top.setdefault(c.text, logprob(c.prob))
        top.setdefault(step.piece, logprob(step.raw_prob))  # the sampled token is always there
        item: dict[str, list[Any]] = {
            "tokens": [step.piece],
            "token_logprobs": [logprob(step.raw_prob)],
            "top_logprobs": [top],
            "text_offset": [self._offset],
        }
        for key, values in item.items():
            self._legacy[key].extend(values)
        return item

    def _echo_chunk(self, prefill: Prefill) -> list[dict[str, Any]]:
        """echo: the prompt as the first text, and with logprobs its tokens' entries (the
        completion's text_offset then counts from the prompt's end)."""
        assert self._echo is not None
        text, item = self._echo.text, None
        if self.options.logprobs:
            item = self._echo.legacy(prefill, self.options.top_logprobs)
            for key, values in item.items():
                self._legacy[key].extend(values)
        self._text.append(text)
        self._offset = len(text)
        return [self._chunk({"content": text}, item)]

    def _finish_chunk(self, finish: Finish) -> dict[str, Any]:
        tail, calls = self._tail, None
        if self._tools is not None:
            tail, calls = self._tools.feed(tail), self._tools.calls()
        reason = tool_finish(finish_reason(finish.reason), calls)
        if calls is not None:
            return self._chunk(tool_delta(calls), None, reason)
        return self._chunk({"content": tail} if tail else {}, None, reason)

    def _tally(self, report: PassReport) -> None:
        """A verifying pass's drafts, once a pass (each step it gave carries its report)."""
        if report.number != self._drafts[2]:
            self._drafts[0] += report.kept
            self._drafts[1] += report.drafted - report.kept
            self._drafts[2] = report.number

    def _usage(self, finish: Finish) -> dict[str, Any]:
        cached = self._prefill.reused_tokens if self._prefill is not None else 0
        prompt, completion = finish.prompt_tokens, finish.completion_tokens
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion if prompt is not None and completion is not None else None,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        if self.options.prediction:  # (OpenAI's names: the drafts the verifying passes kept and refused)
            kept, refused = self._drafts[:2]
            usage["completion_tokens_details"] = {
                "accepted_prediction_tokens": kept,
                "rejected_prediction_tokens": refused,
            }
        return usage

    def _usage_chunk(self, finish: Finish) -> dict[str, Any]:
        obj = self._base()
        if self.options.chat:
            obj["system_fingerprint"] = None
        obj["choices"] = []
        obj["usage"] = self._usage(finish)
        return obj

    # ---- the whole body -------------------------------------------------------------
    def body(self) -> dict[str, Any]:
        """The non-streaming response, after the Finish."""
        finish = self._finish
        if finish is None:
            raise RuntimeError("body() before the generation finished")
        if self.error is not None:
            return error_body(self.error, "server_error", code="generation_error")
        text = "".join(self._text) if self._tools is None else self._tools.text
        calls = self._tools.calls() if self._tools is not None else None
        reason = tool_finish(finish_reason(finish.reason), calls)
        obj: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion" if self.options.chat else "text_completion",
            "created": self.created,
            "model": self.model,
        }
        lp: dict[str, Any] | None
        if self.options.chat:
            obj["system_fingerprint"] = None
            lp = {"content": self._logprobs, "refusal": None} if self.options.logprobs else None
            obj["choices"] = [
                {
                    "index": 0,
                    "message": tool_message(text, calls),
                    "logprobs": lp,
                    "finish_reason": reason,
                }
            ]
        else:
            lp = self._legacy if self.options.logprobs else None
            obj["choices"] = [{"text": text, "index": 0, "logprobs": lp, "finish_reason": reason}]
        obj["usage"] = self._usage(finish)
        if self.options.extension:
            obj[EXTENSION_KEY] = {"events": self._events}
        return obj


def start_record(start: Start, options: WireOptions) -> Start:
    """The Start as a response carries it: the model file's name, not the server's folders
    (None: a remote model's, not given); the request's seed beside the one drawn with; and
    without the prompt unless asked for (`loopchat: {"prompt": true}`): the messages (the
    client has them), the rendered text (with the chat template's own system prompt, if it
    adds one) and its tokens, the bulk of a first chunk."""
    start = replace(start, model_path=start.model_path and os.path.basename(start.model_path))
    if options.seed_requested is not None:
        start = replace(start, seed_requested=options.seed_requested)
    if options.prompt:
        return start
    return replace(
        start, messages=(), prompt_text=None, prompt_token_ids=None, prompt_token_texts=(), prompt_special=()
    )


def token_logprob(step: Step, n: int) -> dict[str, Any]:
    """A token's logprob entry, OpenAI's shape (chat logprobs, the Responses API's output_text's):
    the raw softmax's, with the top n."""
    return {
        "token": step.piece,
        "logprob": logprob(step.raw_prob),
        "bytes": _step_bytes(step),
        "top_logprobs": [_top(c) for c in step.raw_top[:n]],
    }


def _top(c: Candidate) -> dict[str, Any]:
    raw = list(c.piece_bytes) if c.piece_bytes is not None else token_bytes(c.text)
    return {"token": c.text, "logprob": logprob(c.prob), "bytes": raw}


def error_body(
    message: str, type: str = "invalid_request_error", *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# ---- the other way: a loopchat server's extension back into events -------------------

#: The order in which one chunk's extension items happened.
_ORDER = ("start", "context_trimmed", "prefill", "step", "finish")


def extension_events(obj: dict[str, Any]) -> list[Event]:
    """The events a chunk (or a body) of a loopchat server carries, in order ([] for a
    chunk of any other server). Raises ValueError for a malformed extension."""
    ext = obj.get(EXTENSION_KEY)
    if not isinstance(ext, dict):
        return []
    try:
        if "events" in ext:
            return [event_from_json_dict(e) for e in ext["events"]]
        return [event_from_json_dict(ext[k]) for k in _ORDER if k in ext]
    except (TypeError, KeyError, ValueError) as exc:
        raise ValueError(f"malformed {EXTENSION_KEY!r} extension: {exc}") from exc


__all__ = [
    "DONE_LINE",
    "EXTENSION_KEY",
    "MAX_COMPLETION_LOGPROBS",
    "MAX_TOP_LOGPROBS",
    "NO_LOGPROB",
    "WireOptions",
    "WireSerializer",
    "error_body",
    "extension_events",
    "finish_reason",
    "logprob",
    "sse_line",
    "start_record",
    "token_bytes",
]
