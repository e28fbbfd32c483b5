"""What every route of `loopchat serve` answers with besides its body: OpenAI's error shape,
a run's WorkerError as its status, the client's leaving, a run waited out."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from loopchat.events import RunDone, WorkerError
from loopchat.serve.loop import Run
from loopchat.wire import error_body


def error(
    status: int,
    message: str,
    type: str = "invalid_request_error",
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type, param=param, code=code), status_code=status, headers=headers)


async def disconnected(request: Request) -> None:
    """Returns when the client has gone (the body has been read: nothing else comes)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_done(run: Run) -> None:
    while not isinstance(await run.events.get(), RunDone):
        pass


def worker_error(error_: WorkerError, param: str) -> JSONResponse:
    if error_.internal:
        return error(500, error_.message, "server_error", code="internal_error")
    if error_.context_overflow:  # OpenAI's code for it, naming what was too long
        return error(400, error_.message, param=param, code="context_length_exceeded")
    return error(400, error_.message, code="invalid_prompt")
