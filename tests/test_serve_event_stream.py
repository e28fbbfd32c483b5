"""A stream's response (serve/event_stream.py) on its own: the run's events as SSE through ASGI's
`send`, what has queued up behind an event in one `send`, [DONE] last with the body's end, an
error after the start as an error chunk, and a stream ended early (its task cancelled) cancels
its run and stops watching for the client. The bytes themselves: tests/test_serve*.py's real
servers and clients."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any, cast

from loopchat.events import RunDone, WorkerError
from loopchat.serve.event_stream import EventStream
from loopchat.serve.loop import Run
from loopchat.wire import DONE_LINE, error_body, sse_line


class _Lines:
    """A serializer's face: one line an event (two for "two")."""

    def lines(self, event: Any) -> list[str]:
        return [f"data: {event}\n\n"] * (2 if event == "two" else 1)


class _Loop:
    def __init__(self) -> None:
        self.cancelled: list[Run] = []

    def cancel(self, run: Run) -> None:
        self.cancelled.append(run)


def _stream(run: Run, first: Any, gone: asyncio.Future[None]) -> tuple[EventStream, _Loop]:
    loop = _Loop()
    return EventStream(cast(Any, loop), run, cast(Any, _Lines()), first, gone), loop


async def _receive() -> MutableMapping[str, Any]:  # pragma: no cover - the response never reads it
    raise AssertionError("EventStream does not read receive")


def test_queued_events_go_in_one_send_and_done_ends_the_body() -> None:
    async def main() -> list[Any]:
        run, sent = Run(), list[Any]()
        gone = asyncio.get_running_loop().create_future()

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)
            if len(sent) == 2:  # (the first event written: the rest arrive now)
                for event in ("b", "two", RunDone(1)):
                    run.record(event, closing=False)

        stream, loop = _stream(run, "a", gone)
        await stream({"type": "http"}, _receive, send)
        assert gone.cancelled() and loop.cancelled == []  # (done: nothing to cancel)
        return sent

    start, first, rest = asyncio.run(main())
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert headers[b"cache-control"] == b"no-cache" and headers[b"x-accel-buffering"] == b"no"
    assert first == {"type": "http.response.body", "body": b"data: a\n\n", "more_body": True}
    body = "data: b\n\n" + "data: two\n\n" * 2 + DONE_LINE
    assert rest == {"type": "http.response.body", "body": body.encode(), "more_body": False}


def test_an_error_after_the_start_is_an_error_chunk() -> None:
    async def main() -> list[Any]:
        run, sent = Run(), list[Any]()
        run.record(WorkerError("it broke", "generate"), closing=False)
        run.record(RunDone(1), closing=False)

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        stream, _ = _stream(run, "a", asyncio.get_running_loop().create_future())
        await stream({"type": "http"}, _receive, send)
        return sent

    _, body = asyncio.run(main())
    error = sse_line(error_body("it broke", "server_error", code="generation_error"))
    assert body["body"] == ("data: a\n\n" + error + DONE_LINE).encode() and body["more_body"] is False


def test_a_stream_ended_early_cancels_its_run() -> None:
    async def main() -> tuple[Run, _Loop, asyncio.Future[None]]:
        run = Run()
        gone = asyncio.get_running_loop().create_future()
        written = asyncio.Event()

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.body":
                written.set()

        stream, loop = _stream(run, "a", gone)
        task = asyncio.ensure_future(stream({"type": "http"}, _receive, send))
        await written.wait()  # (the first event written: the stream waits for the next)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return run, loop, gone

    run, loop, gone = asyncio.run(main())
    assert loop.cancelled == [run] and gone.cancelled()
