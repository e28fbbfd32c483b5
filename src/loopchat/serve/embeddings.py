"""`loopchat serve`'s POST /v1/embeddings: OpenAI's embeddings endpoint, on the model served.

The body: `input` (a string, a list of strings, a list of token ids, or a list of such lists:
at most MAX_INPUTS), `encoding_format` ("float", or "base64": the float32 values' little-endian
bytes, what OpenAI's SDKs ask for by default and decode), `dimensions` (only the model's own
width: its vectors cannot be cut shorter and stay what they are), `model`, `user` (read as the
chat endpoints read them). The vectors are engine/embedder.py's; the `loopchat` extension says
how they were pooled and each input's token count.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from loopchat.engine.embedder import EmbedCancelled, Embedded, Embedder, EmbedInputError, EmbedWidthError
from loopchat.serve.http_errors import disconnected, error
from loopchat.serve.request_error import RequestError
from loopchat.serve.requests import parse_json

#: inputs a request may hold at most (OpenAI's limit)
MAX_INPUTS = 2048
FORMATS = ("float", "base64")


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    inputs: list[str | list[int]]
    base64: bool
    model: str | None
    dimensions: Any  # (None: not given; the embedder checks it against the model's width)


def parse_embeddings(body: dict[str, Any]) -> EmbeddingRequest:
    """The body as an EmbeddingRequest (RequestError, naming the parameter, for what cannot run)."""
    inputs = _inputs(body.get("input"))
    fmt = body.get("encoding_format", "float")
    if fmt is None:
        fmt = "float"
    if fmt not in FORMATS:
        raise RequestError(f'encoding_format must be "float" or "base64", got {fmt!r}', param="encoding_format")
    model = body.get("model")
    return EmbeddingRequest(inputs, fmt == "base64", model if isinstance(model, str) else None, body.get("dimensions"))


def _inputs(value: Any) -> list[str | list[int]]:
    """`input` as a list of texts and token lists."""
    what = "input must be a string, a list of strings, a list of token ids or a list of such lists"
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise RequestError(f"{what}, and not empty; got {_shown(value)}", param="input")
    if all(_is_token(t) for t in value):
        return [list(value)]
    if len(value) > MAX_INPUTS:
        raise RequestError(f"input holds {len(value)} inputs: at most {MAX_INPUTS} a request", param="input")
    out: list[str | list[int]] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, list) and item and all(_is_token(t) for t in item):
            out.append(list(item))
        else:
            raise RequestError(f"input[{i}]: {what}; got {_shown(item)}", param="input")
    return out


def _is_token(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def input_problem(exc: EmbedInputError, count: int) -> RequestError:
    """An input the embedder refused, as the request's 400."""
    where = "input" if count == 1 else f"input[{exc.index}]"
    return RequestError(f"{where}: {exc}", param="input")


def embeddings_body(done: Embedded, req: EmbeddingRequest, model_id: str) -> dict[str, Any]:
    """OpenAI's response: a list of embedding objects, the model, the usage; and the extension."""
    data = []
    for i, row in enumerate(done.vectors):
        if req.base64:
            vector: Any = base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
        else:
            vector = row.astype(np.float64).tolist()  # (each float32 exactly, as JSON numbers)
        data.append({"object": "embedding", "index": i, "embedding": vector})
    return {
        "object": "list",
        "data": data,
        "model": model_id,
        "usage": {"prompt_tokens": done.tokens, "total_tokens": done.tokens},
        "loopchat": {"pooling": done.pooling, "normalized": "l2", "tokens": list(done.counts)},
    }


async def respond_embeddings(
    request: Request,
    embedder: Embedder | None,
    check_model: Callable[[str | None], None],
    model_id: str,
    line: Callable[[Request, int, str], None],
) -> Response:
    """The route: the body parsed, the inputs embedded (a 499 if the client leaves first: the
    embedder stops at its next chunk), OpenAI's response; each outcome one log line."""
    req = None
    try:
        if embedder is None:
            raise RequestError("this server has no embedder", status=404, code="not_found")
        req = parse_embeddings(parse_json(await request.body()))
        check_model(req.model)
        done = await _embedded(request, embedder, req)
    except EmbedCancelled:  # (the server is stopping: Embedder.stop_all)
        message = "loopchat serve is shutting down; retry against another server or after it restarts"
        line(request, 503, message)
        return error(503, message, "server_error", code="shutting_down")
    except EmbedWidthError as exc:
        refused = RequestError(
            f"dimensions: this model's embeddings have {exc.n_embd} dimensions, and cannot be cut to {exc.asked!r} "
            "(leave dimensions out, or give it that number)",
            param="dimensions",
            code="unsupported_parameter",
        )
    except EmbedInputError as exc:
        refused = input_problem(exc, len(req.inputs) if req else 1)
    except RequestError as exc:
        refused = exc
    else:
        if done is None:
            line(request, 499, "embeddings · the client disconnected (the embedding stopped)")
            return Response(status_code=499)
        n = len(req.inputs)
        line(request, 200, f"embeddings · {n} input{'' if n == 1 else 's'} · {done.tokens} tokens")
        return JSONResponse(embeddings_body(done, req, model_id))
    line(request, refused.status, f"{refused.type}: {refused.message}")
    return JSONResponse(refused.body(), status_code=refused.status)


async def _embedded(request: Request, embedder: Embedder, req: EmbeddingRequest) -> Embedded | None:
    """The inputs' embeddings, or None if the client left first (the embedder then stops)."""
    stop = threading.Event()
    job: asyncio.Future[Any] = asyncio.wrap_future(embedder.submit(req.inputs, stop, req.dimensions))
    gone: asyncio.Future[Any] = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait([job, gone], return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if job.done():
        done: Embedded = job.result()
        return done
    stop.set()
    with contextlib.suppress(EmbedCancelled, EmbedInputError, EmbedWidthError):
        await job
    return None
