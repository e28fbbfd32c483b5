"""A /v1/completions request whose `prompt` is a list of texts (OpenAI's "batching requests":
one request, several prompts, `choice.index` says whose): a run per prompt on the server's loop.

Prompt i's choices are indexes i * n .. i * n + n - 1 (OpenAI's order). The runs begin in the
prompts' order, one of them waiting for a place at a time (this request never fills the queue
by itself), and run side by side as concurrent requests do (--parallel). The body merges the
runs' bodies: their choices, their usage added up, and under `loopchat` each prompt's own
extension (`prompts`). A stream interleaves the runs' chunks as their tokens come, under one
id, each choice's index shifted; with `stream_options.include_usage` one usage chunk at the end
adds up the runs'. A prompt the engine refuses (too long for the context) is the request's
error: its 400 while nothing was sent, an error chunk once the stream has begun; the other runs
are then cancelled, as they are when the client leaves.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from loopchat.events import RunDone, WorkerError
from loopchat.serve.http_errors import disconnected, error, worker_error
from loopchat.serve.loop import OneLoop, QueueFull, Run, ShuttingDown
from loopchat.serve.request_error import RequestError
from loopchat.serve.requests import GenerationRequest, parse_completion
from loopchat.settings import SamplingSettings
from loopchat.wire import DONE_LINE, error_body, sse_line
from loopchat.wire_batch import serializer_for

_STOP = object()  # a prompt's run has ended (the stream's queue)
#: the prompts a /v1/completions request may list (each a run of its own)
MAX_PROMPTS = 64


def parse_completions(body: dict[str, Any], base: SamplingSettings) -> list[GenerationRequest]:
    """A /v1/completions body: a request per prompt where `prompt` lists several (texts, or lists
    of token ids: at most MAX_PROMPTS; PromptList runs them) or is token ids, else
    parse_completion's one."""
    prompts = _listed(body.get("prompt"))
    if prompts is None:
        return [parse_completion(body, base)]
    if len(prompts) > MAX_PROMPTS:
        raise RequestError(f"prompt holds {len(prompts)} prompts: at most {MAX_PROMPTS} a request", param="prompt")
    return [_one_prompt(body, base, p) for p in prompts]


def _listed(prompt: Any) -> list[Any] | None:
    """`prompt` as the prompts it lists (texts, or lists of token ids); None: one text, for
    parse_completion to read (or refuse)."""
    if not isinstance(prompt, list) or not prompt:
        return None
    if all(_is_id(t) for t in prompt):  # (one prompt, as token ids)
        return [prompt]
    if all(isinstance(p, str) for p in prompt):
        return prompt if len(prompt) > 1 else None
    if all(isinstance(p, list) and p and all(_is_id(t) for t in p) for p in prompt):
        return prompt
    raise RequestError(
        "prompt must be a text, a list of texts, a list of token ids or a list of such lists (not a mix)",
        param="prompt",
    )


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def _one_prompt(body: dict[str, Any], base: SamplingSettings, prompt: str | list[int]) -> GenerationRequest:
    """One prompt's request: a text's, or token ids' (the engine checks them against the vocabulary)."""
    if isinstance(prompt, str):
        return parse_completion({**body, "prompt": prompt}, base)
    request = parse_completion({**body, "prompt": ""}, base)
    return dataclasses.replace(request, reply=request.reply.with_(prompt_ids=tuple(prompt)))


class PromptList:
    def __init__(
        self, loop: OneLoop, model_id: str, reqs: list[GenerationRequest], log: Callable[[Run, str], None]
    ) -> None:
        self.loop, self.model_id, self.reqs, self.log = loop, model_id, reqs, log
        self.n = reqs[0].reply.n
        self.runs: list[Run] = []
        self._turns = asyncio.Lock()  # one of this request's prompts waits for a place at a time
        self._closed = False  # the client left, or a prompt failed: no run begins any more
        self._ended: asyncio.Queue[Any] = asyncio.Queue()

    async def respond(self, request: Request) -> Response:
        gone = asyncio.ensure_future(disconnected(request))
        gone.add_done_callback(lambda f: None if f.cancelled() else self.cancel())
        stream = self.reqs[0].wire.stream
        tasks = [asyncio.ensure_future(self._one(i, req)) for i, req in enumerate(self.reqs)]
        if stream:
            return await self._stream(tasks, gone)
        try:
            results = await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            gone.cancel()
        problem = next((r for r in results if isinstance(r, Response | BaseException)), None)
        if isinstance(problem, BaseException):
            raise problem
        if problem is not None:
            return problem
        if gone.done() and not gone.cancelled():  # the client left: nobody reads a status
            return Response(status_code=499)
        return JSONResponse(merged_body([r for r in results if isinstance(r, dict)]))

    def cancel(self) -> None:
        """Every run begun ends within a pass; a prompt not begun yet will not begin."""
        self._closed = True
        for run in self.runs:
            self.loop.cancel(run)

    async def _one(self, i: int, req: GenerationRequest) -> dict[str, Any] | Response:
        """Prompt i's run: its body, or the Response that ends the request (and cancels the others)."""
        try:
            async with self._turns:
                if self._closed:
                    await self._ended.put(_STOP)
                    return {}
                run = await self.loop.begin(req)
        except (QueueFull, ShuttingDown) as exc:
            self.cancel()
            busy = isinstance(exc, QueueFull)
            message = (
                f"the loop is busy and {self.loop.queue_limit} requests already wait for it; retry shortly"
                if busy
                else "loopchat serve is shutting down"
            )
            await self._ended.put((i, WorkerError(message, "generate")))
            if busy:
                return error(429, message, "rate_limit_exceeded", code="queue_full", headers={"Retry-After": "1"})
            return error(503, message, "server_error", code="shutting_down")
        self.runs.append(run)
        if self._closed:  # (it got its place after the request ended)
            self.loop.cancel(run)
        run.on_done = lambda r: self.log(r, f"prompt {i + 1} of {len(self.reqs)}")
        serializer = serializer_for(self.model_id, req.wire, req.reply.n)
        shift = i * self.n
        while True:
            event = await run.events.get()
            if isinstance(event, RunDone):
                break
            if isinstance(event, WorkerError):
                self.cancel()
                event = dataclasses.replace(event, message=f"prompt[{i}]: {event.message}")
                await self._ended.put((i, event))
                return worker_error(event, f"prompt[{i}]")
            chunks = serializer.feed(event)
            if req.wire.stream:
                await self._ended.put((i, [_shifted(c, shift) for c in chunks]))
        await self._ended.put(_STOP)
        if req.wire.stream or not serializer.done:  # (not done: cancelled before its first step)
            return {}
        return _shifted(serializer.body(), shift)

    async def _stream(self, tasks: list[asyncio.Task[Any]], gone: asyncio.Future[None]) -> Response:
        first = await self._ended.get()  # (the first prompt's first chunks, or an error: the request's)
        if isinstance(first, tuple) and isinstance(first[1], WorkerError):
            gone.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            return next(r for r in results if isinstance(r, Response))

        async def body() -> AsyncIterator[str]:
            item, ended, usage, named = first, 0, None, None
            try:
                while True:
                    if item is _STOP:
                        ended += 1
                        if ended == len(tasks):
                            break
                    elif isinstance(item[1], WorkerError):
                        yield sse_line(error_body(item[1].message, "server_error", code="generation_error"))
                        break
                    else:
                        for chunk in item[1]:
                            named = named or (chunk.get("id"), chunk.get("created"))
                            chunk = {**chunk, "id": named[0], "created": named[1]}  # (one response's chunks)
                            if chunk.get("choices") == [] and chunk.get("usage"):  # (one at the end, added up)
                                usage = (
                                    chunk
                                    if usage is None
                                    else {**chunk, "usage": _added(usage["usage"], chunk["usage"])}
                                )
                            else:
                                yield sse_line(chunk)
                    item = await self._ended.get()
                if usage is not None:
                    yield sse_line(usage)
                yield DONE_LINE
            finally:  # (the runs still going are cancelled, and their tasks end with them)
                gone.cancel()
                self.cancel()

        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _shifted(obj: dict[str, Any], shift: int) -> dict[str, Any]:
    """A chunk or body with its choices' indexes moved up by `shift` (prompt i's: i * n)."""
    if shift and obj.get("choices"):
        obj = {**obj, "choices": [{**c, "index": c["index"] + shift} for c in obj["choices"]]}
    return obj


def _added(usage: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Two usage objects added up, field by field (the nested details too)."""
    out = dict(usage)
    for key, value in other.items():
        if isinstance(value, int) and isinstance(out.get(key), int):
            out[key] += value
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _added(out[key], value)
    return out


def merged_body(bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs' bodies as one: the first's id and fields, every choice in index order, the usage
    added up, each prompt's extension under loopchat.prompts."""
    out = dict(bodies[0])
    out["choices"] = sorted((c for b in bodies for c in b["choices"]), key=lambda c: c["index"])
    usage = bodies[0].get("usage")
    for b in bodies[1:]:
        if usage is not None and b.get("usage") is not None:
            usage = _added(usage, b["usage"])
    out["usage"] = usage
    if "loopchat" in out:
        out["loopchat"] = {"prompts": [b.get("loopchat") for b in bodies]}
    return out
