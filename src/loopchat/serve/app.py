"""`loopchat serve`: the HTTP application (Starlette), OpenAI-compatible.

    POST /v1/chat/completions   chat messages, through the model's chat template
    POST /v1/completions        a raw document the model continues (no template)
    POST /v1/responses          OpenAI's Responses API (responses_api.py; kept ones: GET, DELETE)
    POST /v1/embeddings         a unit vector per input (serve/embeddings.py)
    /v1/conversations, /v1/files, /v1/batches: conversations.py, files_api.py, batches_api.py
    GET  /v1/models, /health    the one model served; open without the API key: status, busy

Bodies are wire.py's objects: a stream is `WireSerializer.lines` for each event the
engine emits, written as they come, then `data: [DONE]` (the exact bytes the chat's wire
view shows for a local reply); a blocking request gets `WireSerializer.body()` after the
whole loop. Every error is OpenAI's error shape with a status its clients map to their
exception classes (400, 401, 404, 429, 500, 503).

The loop is shared (loop.py, batch_loop.py): up to --parallel generations at once, sharing each
forward pass, the others wait their turn. A client that disconnects, while it waits or mid-reply
(or a request cancelled inside the server: a batch's), cancels its generation within one step;
each request logs one line (`log`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loopchat.engine.embedder import Embedder
from loopchat.event_lines import summary_line
from loopchat.events import RunDone, WorkerError
from loopchat.serve.batches_api import BatchStore, batch_routes
from loopchat.serve.conversations import ConversationStore, conversation_routes
from loopchat.serve.embeddings import respond_embeddings
from loopchat.serve.event_stream import EventStream
from loopchat.serve.files_api import FileStore, file_routes
from loopchat.serve.http_errors import disconnected as _disconnected
from loopchat.serve.http_errors import error as _error
from loopchat.serve.http_errors import until_done as _until_done
from loopchat.serve.http_errors import worker_error as _worker_error
from loopchat.serve.loop import OneLoop, QueueFull, Run, ShuttingDown
from loopchat.serve.prompt_list import PromptList, parse_completions
from loopchat.serve.request_error import RequestError
from loopchat.serve.request_ids import RequestIds, request_id
from loopchat.serve.requests import GenerationRequest, parse_chat, parse_completion, parse_json
from loopchat.serve.response_store import ResponseStore, input_items_routes
from loopchat.serve.responses_api import parse_responses
from loopchat.serve.responses_wire import ResponsesSerializer
from loopchat.serve.served_model import ServedModel
from loopchat.wire import WireSerializer
from loopchat.wire_batch import BatchSerializer, serializer_for

#: each endpoint's parser, and the parameter a prompt too long for the context is said of
_PARSERS = {
    "chat": (parse_chat, "messages"),
    "completion": (parse_completion, "prompt"),
    "responses": (parse_responses, "input"),
}

ENDPOINTS = (
    "POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, GET /v1/responses/{id}, "
    "POST /v1/embeddings, /v1/conversations, /v1/files, /v1/batches, GET /v1/models and GET /health"
)


class _Routes:
    """The served state (the loop, the model, the API key, the log) and the routes over it."""

    def __init__(
        self,
        loop: OneLoop,
        model: ServedModel,
        api_key: str | None,
        log: Callable[[str], None],
        embedder: Embedder | None,
    ) -> None:
        self.loop, self.model, self.api_key, self.log, self.embedder = loop, model, api_key, log, embedder
        self.kept = ResponseStore()  # the Responses API's (previous_response_id, GET /v1/responses/{id})
        self.threads = ConversationStore()  # the Conversations API's (a response's `conversation`)
        self.files = FileStore()  # the Files API's, for the Batch API's input and output
        self.batches = BatchStore(self.files, api_key, log)

    def line(self, request: Request, status: int, text: str) -> None:
        client = request.client.host if request.client else "-"
        rid = request_id(request)  # (the response's x-request-id: a client's report of it finds this line)
        self.log(f"{client} {request.method} {request.url.path} {status} · {text}" + (f" · {rid}" if rid else ""))

    def denied(self, request: Request) -> JSONResponse | None:
        api_key, line = self.api_key, self.line
        if api_key is None:
            return None
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            message = (
                "missing API key: send the header Authorization: Bearer <key> (the key loopchat serve was started with)"
            )
        elif not secrets.compare_digest(given.strip().encode(), api_key.encode()):
            message = "incorrect API key: use the key loopchat serve was started with (--api-key or LOOPCHAT_API_KEY)"
        else:
            return None
        line(request, 401, message)
        return _error(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def generate(self, request: Request, kind: str) -> Response:
        loop, model, line = self.loop, self.model, self.line
        refusal = self.denied(request)
        if refusal is not None:
            return refusal
        parse, param = _PARSERS[kind]
        try:
            body = parse_json(await request.body())
            if kind == "completion":  # (a list of prompts: a run each, prompt_list.py)
                reqs = parse_completions(body, model.sampling)
            elif kind == "responses":
                reqs = [parse_responses(body, model.sampling, self.kept, self.threads)]
            else:
                reqs = [parse(body, model.sampling)]
            req = reqs[0]
            model.check(req.model)
        except RequestError as exc:
            line(request, exc.status, f"{exc.type}: {exc.message}")
            return JSONResponse(exc.body(), status_code=exc.status)
        mode = "stream" if req.wire.stream else "blocking"
        if len(reqs) > 1:

            def log(run: Run, which: str) -> None:  # (a line per prompt's run)
                line(request, _status(run, req.wire.stream), f"{which} · {_outcome(run, mode)}")

            return await PromptList(loop, model.id, reqs, log).respond(request)

        turn = await self.take_turn(request, req, mode)
        if isinstance(turn, Response):
            return turn
        run, gone = turn
        run.on_done = lambda r: line(request, _status(r, req.wire.stream), _outcome(r, mode))

        def client_left(_: Any) -> None:
            loop.cancel(run)

        if gone.done():
            loop.cancel(run)
        gone.add_done_callback(client_left)
        serializer: Serializer = (  # (n > 1: a choice per reply of a batch)
            ResponsesSerializer(model.id, req.wire, keep=self._keeper(req), conversation=req.thread)
            if kind == "responses"
            else serializer_for(model.id, req.wire, req.reply.n)
        )
        if not req.wire.stream:
            try:
                return await _blocking(run, serializer, param)
            finally:
                gone.remove_done_callback(client_left)
                gone.cancel()
                if not run.done:  # (the task cancelled: a batch's request, the server stopping; as EventStream)
                    loop.cancel(run)

        # streaming: the response starts once the run has started (an error before its
        # first event, e.g. a prompt too long for the context, is still a 4xx)
        first = await run.events.get()
        if isinstance(first, WorkerError):
            gone.remove_done_callback(client_left)
            gone.cancel()
            await _until_done(run)
            return _worker_error(first, param)
        return EventStream(loop, run, serializer, first, gone)  # (`gone` still cancels the run)

    async def take_turn(
        self, request: Request, req: GenerationRequest, mode: str
    ) -> tuple[Run, asyncio.Future[None]] | Response:
        """Waits for the loop: (the run, a future done when the client goes), or the
        response if the client left meanwhile (it leaves the queue) or no turn comes."""
        loop, line = self.loop, self.line
        gone = asyncio.ensure_future(_disconnected(request))
        turn = asyncio.ensure_future(loop.begin(req))
        try:
            await asyncio.wait({gone, turn}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            gone.cancel()
            turn.cancel()
            raise
        if not turn.done():
            turn.cancel()
            with contextlib.suppress(asyncio.CancelledError, QueueFull, ShuttingDown):
                run = await turn
                loop.cancel(run)  # (it got its turn in the same instant)
            line(request, 499, f"{mode}: the client disconnected while waiting for its turn")
            return Response(status_code=499)
        try:
            return turn.result(), gone
        except QueueFull:
            gone.cancel()
            message = (
                f"the loop is busy and {loop.queue_limit} requests already wait for it (loopchat serve "
                f"{loop.turns}; --queue sets how many may wait); retry shortly"
            )
            line(request, 429, message)
            return _error(429, message, "rate_limit_exceeded", code="queue_full", headers={"Retry-After": "1"})
        except ShuttingDown:
            gone.cancel()
            message = "loopchat serve is shutting down; retry against another server or after it restarts"
            line(request, 503, message)
            return _error(503, message, "server_error", code="shutting_down")

    def _keeper(self, req: GenerationRequest) -> Any:
        """Where a finished Responses reply is kept (the response store, its conversation), or None."""
        before, thread, inputs = req.conversation, req.thread, req.inputs
        if before is None and thread is None:
            return None

        def keep(rid: str, output: Any, obj: dict[str, Any]) -> None:
            if before is not None:
                self.kept.put(rid, (*before, *output), obj, inputs)
            if thread is not None:
                self.threads.add(thread, [*inputs, *obj["output"]])

        return keep

    async def stored_response(self, request: Request) -> Response:
        """GET /v1/responses/{id} (a kept response's object), DELETE (it is no longer kept)."""
        refusal = self.denied(request)
        if refusal is not None:
            return refusal
        rid = request.path_params["response_id"]
        found = self.kept.response(rid)
        if found is None:
            message = f"response {rid!r} is not kept here: this server keeps its latest responses in memory"
            return _error(404, message, param="response_id", code="response_not_found")
        if request.method == "DELETE":
            self.kept.delete(rid)
            return JSONResponse({"id": rid, "object": "response.deleted", "deleted": True})
        return JSONResponse(found)

    async def chat_completions(self, request: Request) -> Response:
        return await self.generate(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self.generate(request, "completion")

    async def responses(self, request: Request) -> Response:
        return await self.generate(request, "responses")

    async def embeddings(self, request: Request) -> Response:
        refusal = self.denied(request)
        if refusal is not None:
            return refusal
        return await respond_embeddings(request, self.embedder, self.model.check, self.model.id, self.line)

    async def list_models(self, request: Request) -> Response:
        refusal = self.denied(request)
        if refusal is not None:
            return refusal
        return JSONResponse({"object": "list", "data": [self.model.card()]})

    async def get_model(self, request: Request) -> Response:
        model = self.model
        refusal = self.denied(request)
        if refusal is not None:
            return refusal
        name = request.path_params["model_id"]
        if name not in model.names:
            return _error(
                404,
                f"model {name!r} is not served here: this server runs {model.id!r}",
                param="model",
                code="model_not_found",
            )
        return JSONResponse(model.card())

    async def health(self, request: Request) -> Response:
        loop = self.loop
        status = "stopping" if loop.closing else "ok"
        return JSONResponse(
            {
                "status": status,
                "model": self.model.id,
                "generating": loop.busy,
                "waiting": loop.waiting,
                "queue": loop.queue_limit,
                "parallel": loop.parallel,
                "generations": loop.runs,
                "embedding": self.embedder is not None and self.embedder.busy,
            },
            status_code=503 if loop.closing else 200,
        )

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            message = f"there is no {request.method} {request.url.path} here: loopchat serve has {ENDPOINTS}"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}: loopchat serve has {ENDPOINTS}"
        else:
            message = str(exc.detail)
        self.line(request, exc.status_code, message)
        return _error(exc.status_code, message, code="not_found" if exc.status_code == 404 else None)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        # anyio's backend loaded now, not at the first stream's prefill (its imports competed with it
        # for the cores: docs/performance.md, "Figures behind the code's choices", "The server's first request")
        await anyio.sleep(0)
        self.loop.attach()
        self.batches.app = app  # (a batch's requests go through the application itself)
        try:
            yield
        finally:
            await self.batches.close()
            self.loop.detach()


def create_app(
    loop: OneLoop,
    model: ServedModel,
    *,
    api_key: str | None = None,
    log: Callable[[str], None] = print,
    embedder: Embedder | None = None,
) -> Starlette:
    """The application (`embedder`: POST /v1/embeddings' vectors, closed by the caller after the server)."""
    routes = _Routes(loop, model, api_key, log, embedder)
    return Starlette(
        routes=[
            Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
            Route("/v1/completions", routes.completions, methods=["POST"]),
            Route("/v1/responses", routes.responses, methods=["POST"]),
            Route("/v1/responses/{response_id}", routes.stored_response, methods=["GET", "DELETE"]),
            *input_items_routes(routes.kept, routes.denied),
            Route("/v1/embeddings", routes.embeddings, methods=["POST"]),
            *conversation_routes(routes.threads, routes.denied),
            *file_routes(routes.files, routes.denied),
            *batch_routes(routes.batches, routes.denied),
            Route("/v1/models", routes.list_models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", routes.get_model, methods=["GET"]),
            Route("/health", routes.health, methods=["GET"]),
        ],
        exception_handlers={HTTPException: routes.http_error},
        lifespan=routes.lifespan,
        middleware=[Middleware(RequestIds)],
    )


Serializer = WireSerializer | BatchSerializer | ResponsesSerializer


async def _blocking(run: Run, serializer: Serializer, param: str) -> Response:
    error: WorkerError | None = None
    while True:
        event = await run.events.get()
        if isinstance(event, RunDone):
            break
        if isinstance(event, WorkerError):
            error = event
        else:
            serializer.feed(event)
    if error is not None:
        return _worker_error(error, param)
    if not serializer.done:  # pragma: no cover - a run ends with a Finish or an error
        return _error(500, "the engine ended the run without a reply; this is a bug: please report it", "server_error")
    return JSONResponse(serializer.body(), status_code=500 if serializer.error else 200)


def _status(run: Run, stream: bool) -> int:
    """The status of the request's response (for the log line)."""
    if run.left_at is not None:
        return 499  # nginx's "client closed request": nobody read a status
    if stream and run.start is not None:
        return 200  # the stream had started: an error came as an error chunk
    if run.error is not None:
        return 500 if run.error.internal else 400
    if run.finish is not None and run.finish.error:
        return 500
    return 200


def _outcome(run: Run, mode: str) -> str:
    if run.error is not None and run.finish is None:
        text = f"{mode} · {run.error.message}"
    elif run.finish is not None:
        text = f"{mode} · {summary_line(run.prefill, run.finish)}"
    else:  # pragma: no cover
        text = mode
    if run.left_at is not None:
        extra = (run.finish.steps - run.left_at) if run.finish is not None else 0
        text += f" · client disconnected after {run.left_at} steps (the loop ran {extra} more)"
    return text


__all__ = ["ServedModel", "create_app"]
