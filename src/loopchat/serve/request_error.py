"""A request `loopchat serve` cannot run (requests.py and every route's parsing): an HTTP status and
OpenAI's error object, its parameter named."""

from __future__ import annotations

from typing import Any

from loopchat.wire import error_body


class RequestError(Exception):
    """A request loopchat serve cannot run: an HTTP status and OpenAI's error object."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, param=self.param, code=self.code)
