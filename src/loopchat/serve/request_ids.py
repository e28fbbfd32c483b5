"""`loopchat serve`: an id for every request, in its response's `x-request-id` header and at
the end of the server's log line for it.

OpenAI's API names each request in that header, and its SDKs show it: openai-python's
`completion._request_id` (its README's example) and the `request_id` of an error, the Node
SDK's `_request_id` and `err.requestID`. A client that reports a failure or a slow reply by that
id finds the server's line for it with a search of the log. The id is `req_` and 24 random hex
digits (96 bits: unique for any one server's log); the header goes on every HTTP response of the
application, streamed ones included (it is added once, to the response's start).
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (Starlette is imported when the server starts)
    from starlette.requests import Request
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"


def new_id() -> str:
    return "req_" + secrets.token_hex(12)


def request_id(request: Request) -> str | None:
    """The id RequestIds gave this request (None: it did not pass through it)."""
    return request.scope.get("state", {}).get("request_id")


class RequestIds:
    """ASGI middleware: the request's id into `scope["state"]` (Starlette's `request.state`)
    and into its response's headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = new_id()
        scope.setdefault("state", {})["request_id"] = rid
        header = (HEADER, rid.encode("ascii"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        await self.app(scope, receive, send_with_id)
