"""Real servers on 127.0.0.1 for the remote backend's tests (no mocked HTTP).

- `LlamaCppServer`: llama-cpp-python's own OpenAI-compatible server
  (`python -m llama_cpp.server`) on the default model, in a child process.
- `LoopchatServer`: `loopchat serve --port 0` in a child process.
- `misbehaving_server()`: a small Starlette app on uvicorn, in a thread of the test
  process, that answers the way broken or strict servers do. The path picks the
  behaviour: the base URL http://127.0.0.1:PORT/<mode>/v1 (see MODES).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Child:
    """A server in a child process; `ready` is set when its stderr/stdout says it listens."""

    def __init__(self, args: list[str], marker: str, timeout: float = 120.0) -> None:
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._marker = marker
        threading.Thread(target=self._drain, daemon=True).start()
        if not self.ready.wait(timeout):
            self.stop()
            raise RuntimeError(f"{args[:4]} did not start: {''.join(self.lines)[-2000:]}")

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if self._marker in line:
                self.ready.set()
        self.ready.set()  # it ended: whoever waits reads its output

    def log(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class LlamaCppServer(_Child):
    def __init__(self, model_path: Path) -> None:
        self.port = free_port()
        super().__init__(
            [
                PY,
                "-m",
                "llama_cpp.server",
                "--model",
                str(model_path),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--n_ctx",
                "2048",
                "--n_threads",
                "1",
            ],
            marker="Uvicorn running on",
        )
        if self.proc.poll() is not None:
            raise RuntimeError(f"llama_cpp.server ended: {self.log()[-2000:]}")
        self.url = f"http://127.0.0.1:{self.port}"


class LoopchatServer(_Child):
    def __init__(self, *extra: str) -> None:
        super().__init__(
            [PY, "-m", "loopchat", "serve", "--port", "0", "--threads", "1", *extra], marker="listening on http://"
        )
        line = next((x for x in self.lines if "listening on http://" in x), "")
        if not line:
            raise RuntimeError(f"loopchat serve did not start: {self.log()[-2000:]}")
        self.url = line.split("listening on ")[1].split()[0]


# ---- a misbehaving server ---------------------------------------------------------------

MODEL = "misbehaving-model"
MODEL_2 = "another-model"  # the second of its model list

#: modes: what /<mode>/v1/chat/completions does
MODES = {
    "ok": "a well-formed stream (two tokens in one chunk, a character split between tokens), usage, [DONE]",
    "unauthorized": "401 on every request, OpenAI's error shape",
    "nomodel": "models list fine; chat answers 404 model_not_found",
    "fail": "500 before the stream",
    "fail_mid": "two token chunks, then an error event, then the connection closes",
    "malformed": "two token chunks, then a chunk that is not JSON",
    "cut": "two token chunks, then the connection closes (no finish, no [DONE])",
    "stall": "one token chunk, then nothing until the client goes away",
    "nolist": "no GET /v1/models (404); chat as ok",
    "switch": "whatever state['mode'] says (a test changes it between requests)",
    "noseed": "as ok, but its first token is another each request (the seed sent is ignored, as some servers do)",
}


def chunk(
    content: str | None = None,
    tokens: list[tuple[str, float, list[int] | None]] | None = None,
    finish: str | None = None,
    role: bool = False,
    top: int = 2,
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    logprobs = None
    if tokens:
        logprobs = {
            "content": [
                {
                    "token": t,
                    "logprob": lp,
                    "bytes": b,
                    "top_logprobs": [
                        {"token": t, "logprob": lp, "bytes": b},
                        {"token": "zz", "logprob": lp - 1.0, "bytes": [122, 122]},
                    ][:top],
                }
                for t, lp, b in tokens
            ],
            "refusal": None,
        }
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
    }


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


#: the "ok" stream: "Hi", then "é" split over two tokens in one chunk, then " there"
OK_CHUNKS = [
    chunk(role=True),
    chunk("Hi", [("Hi", -0.1, [72, 105])]),
    chunk("é", [("", -0.5, [0xC3]), ("", -0.2, [0xA9])]),
    chunk(" there", [(" there", -1.5, None)]),
    chunk(finish="stop"),
]
OK_USAGE = {
    "id": "chatcmpl-x",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": MODEL,
    "choices": [],
    "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15},
}


def _error(status: int, message: str, type_: str, code: str | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": type_, "param": None, "code": code}}, status_code=status)


def make_app(state: dict[str, Any]):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def mode_of(request: Request) -> str:
        mode = request.path_params["mode"]
        return state["mode"] if mode == "switch" else mode

    async def models(request: Request):
        if mode_of(request) == "unauthorized":
            return _error(401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key")
        if mode_of(request) == "nolist":
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        meta = {"meta": state["meta"]} if state.get("meta") else {}  # llama-server's (a test sets it)
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": MODEL, "object": "model", "owned_by": "test", **meta},
                    {"id": MODEL_2, "object": "model", "owned_by": "test"},
                ],
            }
        )

    async def chat(request: Request):
        mode = mode_of(request)
        body = await request.json()
        state["requests"].append(body)
        if mode == "unauthorized":
            return _error(401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key")
        if mode == "nomodel":
            return _error(
                404, f"The model `{body.get('model')}` does not exist", "invalid_request_error", "model_not_found"
            )
        if body.get("model") not in (MODEL, MODEL_2):
            return _error(
                404, f"The model `{body.get('model')}` does not exist", "invalid_request_error", "model_not_found"
            )
        if mode == "fail":
            return _error(500, "the server had an error while processing your request", "server_error")
        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": "chatcmpl-x",
                    "object": "chat.completion",
                    "created": 1,
                    "model": MODEL,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "Hié there"},
                            "logprobs": {
                                "content": [
                                    c["choices"][0]["logprobs"]["content"][i]
                                    for c in OK_CHUNKS[1:4]
                                    for i in range(len(c["choices"][0]["logprobs"]["content"]))
                                ]
                            },
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": OK_USAGE["usage"],
                }
            )

        async def events():
            try:
                yield sse(OK_CHUNKS[0])
                n = len(state["requests"])  # noseed: another first token each request
                yield sse(chunk(f"R{n}", [(f"R{n}", -0.1, None)]) if mode == "noseed" else OK_CHUNKS[1])
                if mode == "stall":
                    await asyncio.Event().wait()  # until the client goes away (cancelled then)
                yield sse(OK_CHUNKS[2])
                if mode == "fail_mid":
                    yield sse(
                        {
                            "error": {
                                "message": "CUDA error: out of memory",
                                "type": "server_error",
                                "param": None,
                                "code": None,
                            }
                        }
                    )
                    return
                if mode == "malformed":
                    yield b'data: {"id": "chatcmpl-x", "choices": [\n\n'
                    return
                if mode == "cut":
                    return
                yield b": keep-alive\n\n"
                yield sse(OK_CHUNKS[3])
                yield sse(OK_CHUNKS[4])
                yield sse(OK_USAGE)
                yield b"data: [DONE]\n\n"
            finally:
                state["ended"].set()

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/{mode}/v1/models", models),
            Route("/{mode}/v1/chat/completions", chat, methods=["POST"]),
        ]
    )


@contextmanager
def misbehaving_server() -> Iterator[tuple[str, dict[str, Any]]]:
    """(http://127.0.0.1:PORT, state): the server runs in a thread until the block ends.
    state["requests"] holds the request bodies; state["ended"] is set when a stream's
    generator ends (finished, or cancelled by a disconnect); state["meta"], when a test
    sets it, is the first model's `meta` in GET /models (as llama-server gives)."""
    import uvicorn

    state: dict[str, Any] = {"mode": "ok", "requests": [], "ended": threading.Event()}
    config = uvicorn.Config(make_app(state), host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:  # uvicorn offers no event to wait on
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the misbehaving server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        server.should_exit = True
        thread.join(10)


async def reply_and_replay(backend: Any, tmp_path: Path, settings: Any, size: tuple[int, int] = (120, 40)) -> tuple:
    """The chat on `backend` (a remote server): one reply, F9, then Compare (Ctrl+G):
    (app, original, replay, compare text, each reply's info line)."""
    from tui_fixtures import wait_for, wait_run

    from loopchat.chat.prefs import Prefs
    from loopchat.tui.compare_view import CompareScreen
    from loopchat.tui.launch import create_app

    app = create_app(
        backend=backend, prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json", settings=settings, history=False
    )
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, app.model_ready.is_set, 30, "the model list")
        await pilot.press(*"Name three colours.", "enter")
        await wait_run(pilot)
        await pilot.press("f9")
        await wait_for(pilot, lambda: len(app.conversation.replies) == 2, 10, "the replay")
        await wait_run(pilot)
        original, replay = app.conversation.replies
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen), 5, "compare")
        await pilot.pause()
        compare = app.screen.text
        info = [str(v.info_text()) for v in app.transcript.reply_views()]
        return app, original, replay, compare, info


def start_llama_server(model_path: Path, n_ctx: int) -> _Child:
    """llama.cpp's llama-server (built once by benchmarks/build_llama_bench.sh) on a free
    port with `model_path`, 1 thread; its `url` set. Stop it with `.stop()`."""
    root = Path(__file__).resolve().parents[1]
    cache = Path.home() / ".cache" / "loopchat"
    cache.mkdir(parents=True, exist_ok=True)
    # `make test` runs on two workers: the first to get here builds it, the other waits
    with open(cache / "build_llama_bench.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build = subprocess.run(
            ["bash", str(root / "benchmarks" / "build_llama_bench.sh"), "llama-server"],
            capture_output=True,
            text=True,
            timeout=3600,
        )
    assert build.returncode == 0, build.stderr[-2000:]
    binary = build.stdout.strip().splitlines()[-1]
    port = free_port()
    server = _Child(
        [binary, "-m", str(model_path), "--host", "127.0.0.1", "--port", str(port), "-c", str(n_ctx), "-t", "1"],
        marker="listening on http://",
    )
    server.url = f"http://127.0.0.1:{port}"
    return server
