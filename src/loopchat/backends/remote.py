"""A model on an OpenAI-compatible server (`loopchat --url`, `url = "..."` in models.toml).

One thread per backend sends the requests with httpx (sync) and reads the answer as it
arrives (remote_http.py): a stream of server-sent events (`stream: true`), or one body in
blocking mode.
Every event received is handed on as it came (`WireReceived`, for the wire view), then
the loop's events made from it (wire_reader.py): a loopchat server's own, or what any
other server's chunks give, with every figure it does not send left as None.

What is asked for: `logprobs` with `top_logprobs` (the request's report_k, at most 20),
`stream_options.include_usage`, the settings `temperature`, `top_p`, `max_tokens`, `seed`
(the pinned one, else one the client draws for the reply), plus `top_k`, `min_p`,
`repeat_penalty`, `repeat_last_n`, DRY's four (settings.EXTENSION_KEYS) and `loopchat:
{"prompt": true}` (loopchat serve's start record with the prompt's tokens, for Ctrl+T;
with `"prompt_logprobs": K` when the request asks for the prompt's logprobs),
which OpenAI's API does not have (`extensions = false` in models.toml leaves them out for
a server that refuses unknown fields). A server fixes a request's settings when it
starts: a change made mid-reply applies to the next reply (`live_settings` is False).

Errors (unreachable, refused, 401, 404, 500, an error or a malformed chunk mid-stream, a
stream cut before `data: [DONE]`, a timeout) end the run with one WorkerError line.
`cancel()` shuts the connection's socket down, which ends a read that is waiting at once.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from loopchat import __version__
from loopchat.backends import Sink
from loopchat.backends.live import _Relay
from loopchat.backends.model_meta import ModelMeta
from loopchat.backends.remote_http import RequestCancelled as _Cancelled
from loopchat.backends.remote_http import RequestFailed as _Failed
from loopchat.backends.remote_http import list_models, read_body, read_stream, shut
from loopchat.backends.remote_http import read_some as _read_some
from loopchat.backends.remote_problems import CONNECT_TIMEOUT, status_problem, transport_problem
from loopchat.backends.wire_reader import ServerError, WireError, WireReader
from loopchat.constraint import wire_fields
from loopchat.errors import one_line
from loopchat.events import (
    FinishReason,
    ModelLoading,
    ModelReady,
    RunDone,
    WorkerError,
)
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings, new_seed, wire_values
from loopchat.urls import URLProblem, api_base
from loopchat.wire import MAX_COMPLETION_LOGPROBS, MAX_TOP_LOGPROBS

#: Seconds to wait for the server: for the next bytes of a stream, or for a blocking
#: reply's whole body (and for a connection, at most CONNECT_TIMEOUT).
DEFAULT_TIMEOUT = 120.0


# What the backend's own thread is asked to do (typed, as the engine hosts' commands are).
@dataclass(frozen=True, slots=True)
class _Connect:
    name: str | None  # the server's model id (None: the first of its GET /models)


@dataclass(frozen=True, slots=True)
class _Send:
    run_id: int
    request: ReplyRequest
    cancel: threading.Event


@dataclass(frozen=True, slots=True)
class _Close:
    pass


_Command = _Connect | _Send | _Close


class RemoteBackend:
    can_generate = True
    #: a server fixes a request's settings when it starts: a change applies to the next reply
    live_settings = False
    can_step = False  # step mode needs the engine in this process
    step_refusal = "A server draws its own tokens: step mode needs a local model (--host thread)"
    can_branch = False  # a chat request sends messages, not the tokens of a reply so far
    branch_refusal = "A server takes messages, not the tokens of a reply so far: branching needs a local model"
    control = None

    def vocabulary(self) -> None:
        return None

    def pending_probs(self, token_ids: object) -> None:
        return None

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        model_id: str | None = None,
        api_key: str | None = None,
        system_prompt: str | None = None,
        mode: str | None = None,
        settings: SamplingSettings | None = None,
        description: str = "",
        timeout: float = DEFAULT_TIMEOUT,
        extensions: bool = True,
    ) -> None:
        """`name`: a models.toml entry's name (the chat shows it; the server's models are
        then not offered for switching). Without it the chat shows the model id, and the
        model list is the server's."""
        import httpx

        self.base = api_base(url)
        self.entry = name
        self.model_id = model_id
        self.api_key = api_key or None
        self.system_prompt = system_prompt
        self.mode = mode or "chat"  # models.toml's `mode` (a server's template is its own)
        self.default_settings = settings or SamplingSettings()
        self.description = description
        self.timeout = float(timeout)
        self.extensions = extensions
        self.ready: ModelReady | None = None
        self.loading: str | None = None
        self.served: list[str] = []  # the model ids of the server's GET /models
        self._meta: dict[str, ModelMeta] = {}  # and what each entry's `meta` says (llama-server's)
        self.meta = ModelMeta()  # the model in use's
        self._relay = _Relay()
        self._commands: queue.Queue[_Command] = queue.Queue()
        self._busy = threading.Event()
        self._run_id = 0
        self._cancel: threading.Event | None = None  # the run in flight's
        self._stream: Any = None  # its connection (httpcore's network stream)
        self._lock = threading.Lock()
        self._client = httpx.Client(
            timeout=httpx.Timeout(self.timeout, connect=min(CONNECT_TIMEOUT, self.timeout)),
            # a connection per request: cancelling one shuts its socket down
            limits=httpx.Limits(max_keepalive_connections=0),
            headers={"User-Agent": f"loopchat/{__version__}", "Accept-Encoding": "identity"},
            trust_env=False,
        )
        self._thread = threading.Thread(target=self._main, name="loopchat-remote", daemon=True)
        self._thread.start()

    # ---- what the chat shows ----------------------------------------------------------
    @property
    def name(self) -> str:
        return self.entry or self.model_id or ""

    @property
    def model_names(self) -> list[str]:
        return [] if self.entry else list(self.served)

    def describe(self, name: str) -> str:
        return self.description or f"{name} on {self.base}"

    def placeholder(self) -> str | None:
        return None

    @property
    def busy(self) -> bool:
        return self._busy.is_set()

    # ---- events -----------------------------------------------------------------------
    def attach(self, sink: Sink | None) -> None:
        self._relay.attach(sink)

    def _emit(self, event: Any) -> None:
        if isinstance(event, ModelReady):
            self.ready, self.loading = event, None
        elif isinstance(event, WorkerError) and event.during == "load":
            self.loading = None
        self._relay.emit(event)

    def flush(self) -> None:
        """Events are handed over as they arrive."""

    # ---- the model list -----------------------------------------------------------------
    def start(self) -> None:
        if self.ready is None and self.loading is None:
            self.loading = self.name or self.base
            self._commands.put(_Connect(self.model_id))

    def load(self, name: str) -> None:
        if self.entry is not None or name not in self.served:
            known = ", ".join(self.served) or "none"
            self._emit(WorkerError(f"{self.base} serves no model {name!r} (it serves: {known})", during="load"))
            return
        self.loading = name
        self._commands.put(_Connect(name))

    def _connect(self, model_id: str | None) -> None:
        label = self.entry or model_id or self.base
        self._emit(ModelLoading(name=label, path=self.base))
        t0 = time.perf_counter()
        try:
            ids = self._list_models(required=model_id is None)
        except _Failed as exc:
            self._load_failed(str(exc))
            return
        # (None: the server has no model list.) An id it does not list is sent as it is:
        # llama-server and `loopchat serve` answer any id with the one model they serve
        if ids is not None:
            self.served = ids
            if model_id is None:
                if not ids:
                    self._load_failed(
                        f"{self.base}/models lists no model; name one with --model-id (or model in models.toml)"
                    )
                    return
                model_id = ids[0]
        self.model_id = model_id
        only = next(iter(self._meta.values())) if len(self._meta) == 1 else None  # (what answers any id)
        self.meta = self._meta.get(model_id or "") or only or ModelMeta()
        self._emit(
            ModelReady(
                name=self.name,
                path=self.base,
                n_ctx=self.meta.n_ctx,
                n_vocab=self.meta.n_vocab,
                threads=None,
                load_ms=(time.perf_counter() - t0) * 1000.0,
                mode=self.mode,
            )
        )

    def _load_failed(self, message: str) -> None:
        old = self.ready
        self._emit(WorkerError(message + (f"; still using {old.name}" if old is not None else ""), during="load"))
        if old is not None:
            self._emit(old)

    def _list_models(self, required: bool) -> list[str] | None:
        """The ids of GET /models (and what each says of its model: `_meta`); None for a
        server without that list (404) when a model id was given (`required` False)."""

        def problem(what: Any) -> str:
            if isinstance(what, Exception):
                return self._transport_problem(what, chunks=None, blocking=True)
            return self._status_problem(what.status_code, what.reason_phrase, what.text)

        listed = list_models(self._client, self.base, self._headers(stream=False), problem, required)
        if listed is None:
            return None
        ids, self._meta = listed
        return ids

    # ---- replies ---------------------------------------------------------------------------
    def generate(self, request: ReplyRequest) -> int:
        """`request.stop` is sent as OpenAI's stop strings, `report_k` as top_logprobs (at
        most 20, 5 on /completions), `stream` as the request's. The server keeps its own
        KV cache (`reuse_at_most` has no meaning here) and takes no reply prefix or step
        mode (`can_branch`, `can_step` are False)."""
        self._run_id += 1
        cancel = threading.Event()
        with self._lock:
            self._cancel = cancel
        self._busy.set()
        self._commands.put(_Send(self._run_id, request, cancel))
        return self._run_id

    def set_settings(self, settings: SamplingSettings) -> None:
        """A server fixes the settings of a reply when it starts (`live_settings` is False)."""

    def cancel(self) -> None:
        with self._lock:
            cancel, stream = self._cancel, self._stream
        if cancel is not None:
            cancel.set()
        if stream is not None:
            shut(stream)

    def close(self) -> None:
        self.attach(None)
        self.cancel()
        self._commands.put(_Close())
        self._thread.join(5)
        self._client.close()

    # ---- the thread -----------------------------------------------------------------------
    def _main(self) -> None:
        while True:
            command = self._commands.get()
            if isinstance(command, _Close):
                return
            try:
                match command:
                    case _Connect(name):
                        self._connect(name)
                    case _Send(run_id, request, cancel):
                        self._generate(run_id, request, cancel)
            except Exception as exc:  # a bug: one line, and the thread goes on
                detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
                self._emit(
                    WorkerError(
                        f"internal error while talking to {self.base}: {detail}; this is a bug: please report it",
                        during="load" if isinstance(command, _Connect) else "generate",
                        internal=True,
                    )
                )
                if isinstance(command, _Send):
                    self._end_run(command.run_id)

    def _end_run(self, run_id: int) -> None:
        if self._commands.empty():
            self._busy.clear()
        self._emit(RunDone(run_id))

    def _headers(self, stream: bool) -> dict[str, str]:
        headers = {"Accept": "text/event-stream" if stream else "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def request(self, req: ReplyRequest) -> tuple[str, dict[str, Any], int]:
        """(URL, JSON body, top log-probabilities asked for) of a reply's request."""
        s = req.settings
        body: dict[str, Any] = {"model": self.model_id}
        if req.is_document:
            url = self.base + "/completions"
            k = max(1, min(req.report_k, MAX_COMPLETION_LOGPROBS))
            body.update(prompt=req.messages[0].content, logprobs=k)
        else:
            url = self.base + "/chat/completions"
            k = max(1, min(req.report_k, MAX_TOP_LOGPROBS))
            body.update(messages=[m.to_dict() for m in req.messages], logprobs=True, top_logprobs=k)
        # the settings by their wire names: temperature, top_p, seed (when pinned), max_tokens, and with
        # extensions top_k, min_p, repeat_*, dry_* (settings.SETTINGS: each row's `wire` and `openai`)
        body.update(stream=req.stream, **wire_values(s, self.extensions))
        if req.stream:
            body["stream_options"] = {"include_usage": True}
        if req.stop:
            body["stop"] = list(req.stop)
        body.update(wire_fields(req.constraint))  # a grammar or schema: response_format / grammar
        if req.prediction:  # (OpenAI's Predicted Outputs: loopchat serve drafts from it, as OpenAI does)
            body["prediction"] = {"type": "content", "content": req.prediction}
        if self.extensions:
            body["loopchat"] = {"prompt": True}
            if req.prompt_logprobs is not None:  # the prompt's logprobs in the prefill record
                body["loopchat"]["prompt_logprobs"] = min(req.prompt_logprobs, MAX_TOP_LOGPROBS)
        return url, body, k

    def _trace(self, name: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: keep the request's connection, so cancel() can shut it."""
        if name == "connection.connect_tcp.complete":
            with self._lock:
                self._stream = info.get("return_value")
                cancelled = self._cancel is not None and self._cancel.is_set()
            if cancelled:
                shut(self._stream)

    def _generate(self, run_id: int, request: ReplyRequest, cancel: threading.Event) -> None:
        import httpx

        t0 = time.perf_counter()
        # an unpinned seed: the client draws one, sends it and records it (F9 replays it)
        request = request.with_(settings=request.settings.with_seed(new_seed()))
        url, body, k = self.request(request)
        stream = request.stream
        reader = WireReader(
            source=self.base,
            model=self.model_id or "",
            messages=request.messages,
            settings=request.settings,
            top_logprobs=k,
            stop=request.stop,
            meta=self.meta,
        )

        def now() -> float:
            return (time.perf_counter() - t0) * 1000.0

        try:
            if cancel.is_set():
                raise _Cancelled
            try:
                with self._client.stream(
                    "POST", url, json=body, headers=self._headers(stream), extensions={"trace": self._trace}
                ) as response:
                    if response.status_code != 200:
                        raise _Failed(
                            self._status_problem(response.status_code, response.reason_phrase, _read_some(response))
                        )
                    kind = response.headers.get("content-type", "")
                    if stream and "text/event-stream" in kind:
                        self._read_stream(response, reader, now, run_id, cancel)
                    else:  # blocking, or a server that answered a stream with one body
                        self._read_body(response, reader, now, run_id)
            except (_Failed, _Cancelled):
                raise
            except httpx.HTTPError as exc:
                if cancel.is_set():
                    raise _Cancelled from None
                raise _Failed(self._transport_problem(exc, reader.chunks, blocking=not stream)) from None
            except WireError as exc:
                raise _Failed(f"{self.base} sent {exc}; is it an OpenAI-compatible server?") from None
            except ServerError as exc:
                where = f" mid-reply (after {reader.chunks} chunks)" if reader.chunks else ""
                raise _Failed(f"{self.base} reported an error{where}: {one_line(str(exc))}") from None
            self._emit(reader.end(now()))
        except _Cancelled:
            self._emit(reader.end(now(), FinishReason.CANCELLED))
        except _Failed as exc:
            self._emit(WorkerError(one_line(str(exc)), during="generate"))
        finally:
            with self._lock:
                self._stream = None
            self._end_run(run_id)

    def _read_stream(self, response: Any, reader: WireReader, now: Any, run_id: int, cancel: threading.Event) -> None:
        read_stream(response, reader, now, run_id, cancel, self._emit, self.base)

    def _read_body(self, response: Any, reader: WireReader, now: Any, run_id: int) -> None:
        read_body(response, reader, now, run_id, self._emit)

    def _status_problem(self, code: int, reason: str, text: str) -> str:
        return status_problem(self.base, code, reason, text)

    def _transport_problem(self, exc: Exception, chunks: int | None, blocking: bool) -> str:
        return transport_problem(self.base, self.timeout, exc, chunks, blocking)


__all__ = ["DEFAULT_TIMEOUT", "RemoteBackend", "URLProblem", "api_base"]
