"""`loopchat serve`: a request body -> what the loop runs and what the response looks like.

`parse_chat` (/v1/chat/completions) and `parse_completion` (/v1/completions: the prompt
is a raw document, no chat template) turn OpenAI's request bodies into a
`GenerationRequest`: the reply the engine runs (a `ReplyRequest`: the messages, the
SamplingSettings (the model's own from models.toml, with what the request sets), the
stop strings, how many candidates the engine reports per step, the KV cache reuse,
ignore_eos), and serve's own part: the WireOptions of the response and the model
named. Every problem raises a `RequestError` whose `body()` is OpenAI's error shape,
with the parameter named and a message that says what is supported.

Accepted besides OpenAI's parameters (extensions): top_k, min_p, repeat_penalty,
repeat_last_n, dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n
(loopchat's sampling settings, llama-server's names: settings.EXTENSION_KEYS), `cache_prompt: false` (llama.cpp's name:
evaluate the whole prompt instead of reusing the KV cache of the previous request, so
that the same seed gives the same reply whatever ran before), `ignore_eos: true` (also
llama.cpp's: an end-of-generation token does not end the reply, which then runs to
max_tokens: for benchmarks), `loopchat: false` (no `loopchat` extension objects in
the response) and `loopchat: {"prompt": true}` (the extension's start record with the
prompt: the messages, the rendered text and its tokens; left out unless asked, they are
the bulk of a first chunk). Unknown keys are ignored, as OpenAI's
own unknown fields (`user`, `metadata`, ...) must be.

`seed` takes what OpenAI and llama.cpp clients send, not only loopchat's 0..2^32-1:
-1 is llama.cpp's "random" (a fresh seed is drawn, as with no seed), and any other
64-bit value (-2^63 to 2^64-1) is reduced to its low 32 bits (seed mod 2^32, what C's
cast to uint32 gives, as llama.cpp's server does). The response's start record says
both: `settings.seed` the seed drawn with, `seed_requested` the request's value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from loopchat.batch import SEQUENCES_MAX, check_n
from loopchat.events import DOCUMENT, Message
from loopchat.request import ReplyRequest
from loopchat.serve.chat_messages import chat_messages, tool_read
from loopchat.serve.constraints import FormatProblem, constraint_of
from loopchat.serve.request_error import RequestError
from loopchat.serve.tools import ToolChoice, tool_choice, with_tools
from loopchat.settings import SETTING, SETTINGS, SamplingSettings, SettingsError
from loopchat.stop_strings import MAX_STOP_STRINGS
from loopchat.wire import MAX_COMPLETION_LOGPROBS, MAX_TOP_LOGPROBS, WireOptions

#: The candidates the engine reports per step at least (the extension's top-K, the panel's);
#: with the extension off (`loopchat: false`) only the top_logprobs asked for (at least 1),
#: as llama-server's n_probs: nothing else reads the others.
MIN_REPORT = 10
#: Request keys that set a sampling setting, and the setting: each row's wire name and
#: aliases (settings.SETTINGS; max_completion_tokens follows max_tokens: the newer name wins
#: when both are given); the seed has its own parser here (`_seed`: -1 and 64-bit seeds).
SETTING_KEYS = {key: spec.name for spec in SETTINGS if spec.name != "seed" for key in (spec.wire, *spec.wire_aliases)}
#: The seeds a request may give (64-bit, signed or not), and the one that means "random".
SEED_MIN, SEED_MAX, SEED_RANDOM = -(2**63), 2**64 - 1, -1


@dataclass(frozen=True)
class GenerationRequest:
    reply: ReplyRequest  # what the engine runs, passed to it whole
    wire: WireOptions  # what the response looks like
    model: str | None  # as the request named it (None: not given)
    #: the Responses API's kept conversation (serve/response_store.py): the chat messages before the
    #: reply, as a later previous_response_id continues them; None: not kept
    conversation: tuple[dict[str, Any], ...] | None = None
    #: a Responses request's input items (serve/conversations.py's items: each with its id), kept with
    #: the response (GET .../input_items) and added to its conversation; the conversation's id (`thread`)
    inputs: tuple[dict[str, Any], ...] = ()
    thread: str | None = None


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise RequestError(
            f"the request body is not valid JSON ({exc}); send a JSON object with Content-Type: application/json"
        ) from None
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def parse_chat(body: dict[str, Any], base: SamplingSettings) -> GenerationRequest:
    """A /v1/chat/completions body."""
    _refuse_unsupported(body, chat=True)
    messages = chat_messages(body.get("messages"))
    tools = tool_read(tool_choice, body)
    if tools is not None:
        messages = with_tools(messages, tools)
    logprobs = _optional(body, "logprobs", bool, "true or false (top_logprobs says how many candidates)")
    top = _optional(body, "top_logprobs", int, f"a whole number from 0 to {MAX_TOP_LOGPROBS}")
    if top is not None:
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise RequestError(f"top_logprobs must be from 0 to {MAX_TOP_LOGPROBS}, got {top}", param="top_logprobs")
        if not logprobs:
            raise RequestError("top_logprobs requires logprobs: true", param="top_logprobs")
    return _request(body, base, messages, chat=True, logprobs=bool(logprobs), top=top or 0, tools=tools)


def parse_completion(body: dict[str, Any], base: SamplingSettings) -> GenerationRequest:
    """A /v1/completions body: the prompt is a document the model continues, as it is."""
    _refuse_unsupported(body, chat=False)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise RequestError(
            "prompt must be text (a string, or a list of them) or token ids (a list of them, or a list of "
            "such lists): the document the model continues",
            param="prompt",
        )
    n = _optional(body, "logprobs", int, f"a whole number from 0 to {MAX_COMPLETION_LOGPROBS} on /v1/completions")
    if n is not None and not 0 <= n <= MAX_COMPLETION_LOGPROBS:
        raise RequestError(
            f"logprobs must be from 0 to {MAX_COMPLETION_LOGPROBS} on /v1/completions, got {n} "
            "(the chat endpoint gives up to 20 with top_logprobs)",
            param="logprobs",
        )
    echo = bool(_optional(body, "echo", bool, "true or false (the prompt sent back before the completion)"))
    score_only = _scores_only(body)
    if score_only:  # (the settings' max_tokens stays valid: nothing reads it)
        body = {k: v for k, v in body.items() if k not in ("max_tokens", "max_completion_tokens")}
    request = _request(body, base, (Message(DOCUMENT, prompt),), chat=False, logprobs=n is not None, top=n or 0)
    if score_only:
        request = replace(request, reply=request.reply.with_(score_only=True))
    if not echo:
        return request
    # echo + logprobs: the prompt's own logprobs too, computed during the prefill
    reply = request.reply.with_(prompt_logprobs=n) if n is not None else request.reply
    return replace(request, reply=reply, wire=replace(request.wire, echo=True))


def _scores_only(body: dict[str, Any]) -> bool:
    """max_tokens (or max_completion_tokens) 0 on /v1/completions: the prompt is evaluated, scored
    with `echo` and `logprobs`, and nothing is generated (OpenAI's old way to score a text)."""
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit != 0 or isinstance(limit, bool):
        return False
    _one_reply(body, "n", "max_tokens 0 scores the prompt and writes nothing: n must be 1")
    return True


def _one_reply(body: dict[str, Any], param: str, message: str) -> None:
    """A request whose option is for one reply (RequestError `message` where n asks for more)."""
    if body.get("n") not in (None, 1):
        raise RequestError(message, param=param)


def _request(
    body: dict[str, Any],
    base: SamplingSettings,
    messages: tuple[Message, ...],
    *,
    chat: bool,
    logprobs: bool,
    top: int,
    tools: ToolChoice | None = None,
) -> GenerationRequest:
    stream = bool(_optional(body, "stream", bool, "true or false"))
    include_usage = False
    options = body.get("stream_options")
    if stream and options is not None:  # (ignored without stream, as llama.cpp's server does)
        if not isinstance(options, dict):
            raise RequestError('stream_options must be an object, e.g. {"include_usage": true}', param="stream_options")
        include_usage = bool(
            _optional(options, "include_usage", bool, "true or false", param="stream_options.include_usage")
        )
    extension, prompt, prompt_logprobs = _extension(body.get("loopchat"))
    cache_prompt = _optional(body, "cache_prompt", bool, "true or false")
    ignore_eos = _optional(body, "ignore_eos", bool, "true or false")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("model must be a string (GET /v1/models lists the one served)", param="model")
    seed, requested = _seed(body.get("seed"))
    settings = _settings(body, base)
    if requested is not None:
        settings = settings.replace(seed=seed)
    if seed == requested:  # (used as given: nothing to record)
        requested = None
    prediction = _prediction(body)
    reply = ReplyRequest(
        messages,
        settings,
        prediction=prediction,
        stop=_stop(body.get("stop")),
        report_k=max(MIN_REPORT, top) if extension else max(1, top),
        reuse_at_most=0 if cache_prompt is False else None,  # cache_prompt: false evaluates the whole prompt
        ignore_eos=bool(ignore_eos),
        stream=stream,
        prompt_logprobs=prompt_logprobs,
        constraint=_constraint(body, tools),
        n=int(body.get("n") or 1),
        batch_probes=extension,
        step_detail=extension,
    )
    return GenerationRequest(
        reply=reply,
        wire=WireOptions(
            chat=chat,
            stream=stream,
            logprobs=logprobs,
            top_logprobs=top,
            include_usage=include_usage,
            extension=extension,
            prompt=prompt,
            seed_requested=requested,
            prediction=bool(prediction),
            tools=tools is not None,
        ),
        model=model,
    )


def _prediction(body: dict[str, Any]) -> str:
    """OpenAI's Predicted Outputs, `{"type": "content", "content": TEXT}` (or a list of text parts):
    the text ("": none). Its tokens are the reply's drafts (speculative decoding)."""
    value = body.get("prediction")
    if value is None:
        return ""
    hint = 'prediction must be {"type": "content", "content": "the text the reply is expected to be much like"}'
    if not isinstance(value, dict) or value.get("type") != "content":
        raise RequestError(hint, param="prediction")
    content = value.get("content")
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise RequestError(hint + ' (or a list of {"type": "text", "text": ...} parts)', param="prediction")
    if content:
        _one_reply(body, "prediction", "a prediction drafts one reply's tokens: send it with n = 1")
    return content


def _constraint(body: dict[str, Any], tools: ToolChoice | None) -> Any:
    """response_format / grammar / json_schema (serve/constraints.py), or the tools' JSON form
    (serve/tools.py), as the request's constraint."""
    try:
        asked = constraint_of(body)
    except FormatProblem as exc:
        raise RequestError(str(exc), param=exc.param) from None
    if tools is None:
        return asked
    if asked is not None:
        raise RequestError(
            "tools and a response format or grammar both constrain the reply: send one of them", param="tools"
        )
    _one_reply(body, "n", "tools are read back from one reply: send them with n = 1")
    return tools.constraint()


def _extension(value: Any) -> tuple[bool, bool, int | None]:
    """The request's `loopchat` key: (extension objects on, the prompt in the start record,
    the prompt's logprobs in the prefill record: the top guesses per position, or None)."""
    what = (
        'true, false or an object: {"prompt": true} (the prompt\'s messages, text and tokens in the start '
        'record), {"prompt_logprobs": K} (each prompt token\'s logprob and the top K guesses, 0 to '
        f"{MAX_TOP_LOGPROBS}, in the prefill record)"
    )
    if value is None or isinstance(value, bool):
        return value is not False, False, None
    if not isinstance(value, dict) or set(value) - {"prompt", "prompt_logprobs"}:
        raise RequestError(f"loopchat must be {what}, got {json.dumps(value)}", param="loopchat")
    prompt = _optional(value, "prompt", bool, "true or false", param="loopchat.prompt")
    k = _optional(value, "prompt_logprobs", int, f"0 to {MAX_TOP_LOGPROBS}", param="loopchat.prompt_logprobs")
    if k is not None and not 0 <= k <= MAX_TOP_LOGPROBS:
        raise RequestError(
            f"loopchat.prompt_logprobs must be from 0 to {MAX_TOP_LOGPROBS}, got {k}", param="loopchat.prompt_logprobs"
        )
    return True, bool(prompt), k


def _seed(value: Any) -> tuple[int | None, int | None]:
    """(the seed to draw with, the request's seed): None, None when not given; -1 is
    random (None); other 64-bit seeds are reduced to their low 32 bits."""
    if value is None:
        return None, None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not SEED_MIN <= value <= SEED_MAX:
        raise RequestError(
            f"seed must be a whole number from 0 to {2**32 - 1} (-1: a random seed; other 64-bit values, "
            f"-2^63 to 2^64-1, are reduced to their low 32 bits), got {value!r}",
            param="seed",
        )
    return (None if value == SEED_RANDOM else value % 2**32), value


def _settings(body: dict[str, Any], base: SamplingSettings) -> SamplingSettings:
    changes: dict[str, Any] = {}
    for key in SETTING_KEYS:  # max_completion_tokens comes after max_tokens: it wins
        value = body.get(key)
        if value is None:
            continue
        name = SETTING_KEYS[key]
        try:
            changes[name] = SETTING[name].check(value)
        except SettingsError as exc:
            message = str(exc) if key == name else f"{key} {exc.problem} ({SETTING[name].hint})"
            raise RequestError(message, param=key) from None
    return base.replace(**changes) if changes else base


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    what = f"stop must be a string or a list of up to {MAX_STOP_STRINGS} strings"
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise RequestError(f"{what}, got {value!r}", param="stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise RequestError(f"{what}, got {len(stops)} strings", param="stop")
    if any(s == "" for s in stops):
        raise RequestError("stop strings must not be empty", param="stop")
    return tuple(dict.fromkeys(stops))


def _optional(body: dict[str, Any], key: str, kind: type, what: str, *, param: str | None = None) -> Any:
    """body[key] if it is of `kind` (None when absent or null); RequestError if not."""
    value = body.get(key)
    if value is None:
        return None
    ok = isinstance(value, bool) if kind is bool else isinstance(value, kind) and not isinstance(value, bool)
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not ok:
        raise RequestError(f"{param or key} must be {what}, got {value!r}", param=param or key)
    return value


# ---- what loopchat serve does not do, and says so -------------------------------------


def _refuse_unsupported(body: dict[str, Any], *, chat: bool) -> None:
    def refuse(key: str, message: str) -> None:
        raise RequestError(message, param=key, code="unsupported_parameter")

    n = body.get("n")
    if n is not None and n != 1:
        try:  # n choices: n replies written in one batch (batch.py)
            check_n(int(n) if isinstance(n, float) and n.is_integer() else n)
        except ValueError:
            raise RequestError(
                f"n must be a whole number from 1 to {SEQUENCES_MAX} (choices written in one batch), got {n!r}",
                param="n",
            ) from None
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        refuse("best_of", f"best_of must be 1, got {best_of!r}: loopchat serve generates one completion per request")
    if body.get("functions") or body.get("function_call") not in (None, "none"):
        key = "functions" if body.get("functions") else "function_call"
        refuse(key, f"{key} is OpenAI's older function calling: send the functions as tools (and tool_choice)")
    if not chat and (body.get("tools") or body.get("tool_choice") not in (None, "none")):
        refuse("tools", "tools are for /v1/chat/completions: a completion continues a document")
    if chat and body.get("echo"):
        refuse("echo", "echo is for /v1/completions: the chat's prompt is its messages, which the client has")
    if body.get("suffix"):
        refuse("suffix", "suffix (insertion) is not supported: the model continues the prompt's end")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        refuse("modalities", 'modalities must be ["text"]: loopchat serve generates text only')
    for key in ("audio", "web_search_options"):
        if body.get(key) is not None:
            refuse(key, f"{key} is not supported by loopchat serve")
