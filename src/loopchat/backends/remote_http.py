"""The HTTP side of a remote reply (remote.py): the model list of GET /models, reading a
streamed answer (server-sent events) or a whole body into the WireReader, and shutting a
connection down to cancel. remote.py's thread calls these; what a failure says is
remote_problems.py's.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from typing import Any

from loopchat.backends.model_meta import ModelMeta, model_meta
from loopchat.backends.remote_problems import shorten
from loopchat.backends.sse import SSESplitter
from loopchat.backends.wire_reader import WireError, WireReader
from loopchat.events import WireReceived

#: What is kept of an error response's body for its message.
_ERROR_BODY_LIMIT = 64 * 1024


class RequestFailed(Exception):
    """The request failed: the message is the one line the user sees."""


class RequestCancelled(Exception):
    """The user cancelled the reply while its request was under way."""


def list_models(
    client: Any,
    base: str,
    headers: dict[str, str],
    problem: Callable[[Any], str],
    required: bool,
) -> tuple[list[str], dict[str, ModelMeta]] | None:
    """The ids of GET /models and what each entry's `meta` says (llama-server's); None for
    a server without that list (404) when a model id was given (`required` False).
    `problem(exc_or_response)`: the one line for a transport error or a bad status."""
    import httpx

    try:
        response = client.get(base + "/models", headers=headers)
    except httpx.HTTPError as exc:
        raise RequestFailed(problem(exc)) from None
    if response.status_code == 404:
        if not required:
            return None
        raise RequestFailed(
            f"{base}/models answered 404 Not Found: is {base} an OpenAI-compatible API (its address "
            "usually ends in /v1)? A server without a model list needs the model named: --model-id (or model "
            "in models.toml)"
        )
    if response.status_code != 200:
        raise RequestFailed(problem(response))
    try:
        data = response.json()["data"]
        return [str(m["id"]) for m in data], {str(m["id"]): model_meta(m) for m in data}
    except (ValueError, KeyError, TypeError):
        raise RequestFailed(
            f"{base}/models did not answer with OpenAI's model list; is {base} an "
            "OpenAI-compatible API (its address usually ends in /v1)?"
        ) from None


def read_stream(
    response: Any,
    reader: WireReader,
    now: Callable[[], float],
    run_id: int,
    cancel: threading.Event,
    emit: Callable[[Any], None],
    base: str,
) -> None:
    """Hand on every server-sent event as it arrives (WireReceived), then the loop's events
    the reader makes of it; ends at `data: [DONE]` (or a whole reply without it)."""
    splitter = SSESplitter()
    for data in response.iter_raw():
        t = now()
        for ev in splitter.feed(data):
            emit(WireReceived(ev.text, ev.nbytes, t, run_id))
            if ev.data is None:
                continue  # a comment (a keep-alive ping)
            if ev.data.startswith("[DONE]"):
                if reader.start is None:
                    raise WireError("data: [DONE] before any chunk")
                return
            try:
                obj = json.loads(ev.data)
            except ValueError:
                raise WireError(f"a chunk that is not JSON ({shorten(ev.data)})") from None
            for event in reader.chunk(obj, t):
                emit(event)
        if cancel.is_set():
            raise RequestCancelled
    if cancel.is_set():
        raise RequestCancelled
    if reader.finish_reason is not None:
        return  # the reply is whole; only the closing data: [DONE] is missing
    cut = " (it stopped inside an event)" if splitter.pending().strip() else ""
    raise RequestFailed(
        f"{base} ended the stream before data: [DONE] (after {reader.chunks} chunks){cut}: the reply is "
        "incomplete; the server may have stopped or restarted"
    )


def read_body(
    response: Any, reader: WireReader, now: Callable[[], float], run_id: int, emit: Callable[[Any], None]
) -> None:
    """A blocking reply's one body (or a server that answered a stream with one)."""
    raw = response.read()
    t = now()
    text = raw.decode("utf-8", errors="replace")
    emit(WireReceived(text, len(raw), t, run_id))
    try:
        obj = json.loads(text)
    except ValueError:
        raise WireError(f"a response that is not JSON ({shorten(text)})") from None
    for event in reader.body(obj, t):
        emit(event)


def shut(stream: Any) -> None:
    """Shut a connection's socket down: a read waiting on it returns at once."""
    try:
        sock = stream.get_extra_info("socket")
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, AttributeError):
        pass


def read_some(response: Any) -> str:
    """The start of an error response's body, for its message."""
    data = b""
    try:
        for part in response.iter_raw():
            data += part
            if len(data) >= _ERROR_BODY_LIMIT:
                break
    except Exception:  # noqa: BLE001 - the status is what matters; the body is a detail
        pass
    return data[:_ERROR_BODY_LIMIT].decode("utf-8", errors="replace")
