"""A streamed request's response: its run's events written as SSE, straight to ASGI's `send`.

The bytes are what Starlette's StreamingResponse of app.py's generator wrote until the
thirteenth session (`WireSerializer.lines` for each event, an error chunk for a WorkerError
after the start, then `data: [DONE]`), with the same status and headers; what differs is the
way there, which runs on the event loop's thread once per token of every stream, beside the
forward pass, on a core a llama.cpp thread wanted (docs/performance.md, "The event loop's work
per chunk"):

- no task group and no second task: StreamingResponse (at uvicorn's ASGI spec 2.3) runs the
  body in a task of an anyio task group and reads `receive` in another for the client's
  leaving; here the request's own task writes the body, and the client's leaving is the
  future app.py already watches while the request waits for its turn (`gone`, a read of
  `receive`), kept until the stream ends: it cancels the run (within one pass) as it did
  before the stream started;
- no async generator between the run's queue and `send`: the response awaits the queue
  itself;
- what has queued up behind an event (a stop token's step, its Finish and RunDone arrive in
  one hand-off) goes in one `send`, one socket write.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from loopchat.events import RunDone, WorkerError
from loopchat.serve.loop import OneLoop, Run
from loopchat.serve.responses_wire import ResponsesSerializer
from loopchat.wire import DONE_LINE, WireSerializer, error_body, sse_line
from loopchat.wire_batch import BatchSerializer

_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventStream(Response):
    """The SSE body of `run` from its `first` event on. `gone` is done when the client has
    left (its done callback cancels the run); the stream cancels it when it ends."""

    media_type = "text/event-stream"

    def __init__(
        self,
        loop: OneLoop,
        run: Run,
        serializer: WireSerializer | BatchSerializer | ResponsesSerializer,
        first: Any,
        gone: asyncio.Future[None],
    ) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(_HEADERS)
        self._loop, self._run, self._serializer, self._first, self._gone = loop, run, serializer, first, gone

    def _text(self, event: Any) -> str:
        """The SSE text of one event (RunDone: [DONE])."""
        if type(event) is RunDone:  # (the Responses API's stream ends with its last event: no [DONE])
            return "" if isinstance(self._serializer, ResponsesSerializer) else DONE_LINE
        if isinstance(event, WorkerError):  # after the stream started: an error chunk
            return sse_line(error_body(event.message, "server_error", code="generation_error"))
        lines = self._serializer.lines(event)
        return lines[0] if len(lines) == 1 else "".join(lines)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        run, events, text = self._run, self._run.events, self._text
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            event = self._first
            while True:
                body = text(event)
                while type(event) is not RunDone and not events.empty():  # (queued behind it: one write)
                    event = events.get_nowait()
                    body += text(event)
                done = type(event) is RunDone
                if body or done:
                    await send({"type": "http.response.body", "body": body.encode(), "more_body": not done})
                if done:
                    return
                event = await events.get()
        finally:
            self._gone.cancel()
            if not run.done:  # (the task cancelled: the server stopping, or an error here)
                self._loop.cancel(run)


__all__ = ["EventStream"]
