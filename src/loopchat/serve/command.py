"""`loopchat serve`: an OpenAI-compatible HTTP server on loopchat's own engine and loop.

Start-up: the port is bound first (a port in use fails at once, before the model
loads), then the model loads, then uvicorn serves the Starlette app (serve_app.py) on
that socket and one line on stdout gives the URL. Each request logs one line on stderr.
Ctrl+C or SIGTERM: the generation in progress is cancelled, the open responses end, the
engine is closed and the exit code is 0 (a second Ctrl+C stops without waiting).

Why Starlette on uvicorn: a small, well-kept ASGI stack (Starlette is what FastAPI is
built on; uvicorn its usual server) whose ASGI `send` writes our bytes as they are:
the stream is wire.py's lines (serve/event_stream.py), exactly what the chat's wire view shows. Bodies are
wire.py's plain objects, so no pydantic models are needed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from loopchat.arg_types import whole_number
from loopchat.config import API_KEY_ENV
from loopchat.errors import UsageError
from loopchat.listen import bind, port_number, socket_url
from loopchat.serve.cors import cors_origin, with_cors
from loopchat.threads_setting import threads_or_env

if TYPE_CHECKING:
    import uvicorn

    from loopchat.serve.served_model import ServedModel

DEFAULT_PORT = 8000
DEFAULT_QUEUE = 8
DEFAULT_PARALLEL = 4  # requests generating at once (serve/batch_loop.py)


queue_size = whole_number(0, "{text}: --queue is how many requests may wait, 0 or more")
parallel_count = whole_number(1, "{text}: --parallel is how many requests generate at once, 1 to 16", most=16)


def add_serve_parser(sub: argparse._SubParsersAction, add_model_options: Callable[..., None]) -> None:
    serve = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server on the same engine and loop",
        description="Serve the model over HTTP, OpenAI-compatible: POST /v1/chat/completions, "
        "POST /v1/completions (a raw document, no chat template), POST /v1/responses (OpenAI's Responses API; "
        "its latest 256 responses kept in memory: GET /v1/responses/{id}, previous_response_id), "
        "POST /v1/embeddings (a unit vector per input: its tokens' last hidden states, averaged), "
        "GET /v1/models, GET /health. "
        "Up to --parallel requests generate at once, sharing each forward pass; the others wait their turn.",
    )
    serve.add_argument(
        "--host",
        dest="bind",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="the address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)",
    )
    serve.add_argument(
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        metavar="N",
        help=f"the port (default {DEFAULT_PORT}; 0 picks a free one, printed at start)",
    )
    add_model_options(serve, sub=True)
    serve.add_argument(
        "--api-key",
        metavar="KEY",
        help=f"require Authorization: Bearer KEY (better: set {API_KEY_ENV}, which ps does not show)",
    )
    serve.add_argument(
        "--queue",
        type=queue_size,
        default=DEFAULT_QUEUE,
        metavar="N",
        help=f"how many requests may wait while one generates (default {DEFAULT_QUEUE}); more get 429",
    )
    serve.add_argument(
        "--parallel",
        type=parallel_count,
        default=DEFAULT_PARALLEL,
        metavar="N",
        help=f"how many requests generate at once, sharing each forward pass (default {DEFAULT_PARALLEL}; "
        "1: one at a time, the others wait their turn)",
    )
    serve.add_argument(
        "--strict-model",
        action="store_true",
        help="a request must name the model served (else 404); by default any name, or none, is "
        "answered by it (as llama.cpp's servers do: OpenAI code asking for gpt-4 runs unchanged)",
    )
    serve.add_argument(
        "--cors-origin",
        action="append",
        type=cors_origin,
        metavar="ORIGIN",
        help="a web page origin that may call the server from a browser (repeatable; * any, none: "
        "no page); default: pages on this machine only (localhost, 127.0.0.1, [::1], any port)",
    )


def _log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While the model loads, SIGTERM stops like Ctrl+C (uvicorn handles both later)."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _engine_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """What the command line overrides of the model's models.toml entry."""
    return {
        "verbose": bool(getattr(args, "verbose", False)),
        "threads": threads_or_env(getattr(args, "threads", None)),
        "flash_attn": getattr(args, "flash_attn", None),
    }


def serve_command(args: argparse.Namespace) -> int:
    """Run the server until Ctrl+C or SIGTERM; returns the exit code (0 after a clean
    stop). Bad start-up input raises UsageError/ConfigError/... (one line, exit 2)."""
    from loopchat.config import load_config
    from loopchat.engine.cores import physical_cores
    from loopchat.engine.embedder import Embedder
    from loopchat.engine.options import EngineOptions
    from loopchat.serve.app import create_app
    from loopchat.serve.batch_loop import BatchLoop
    from loopchat.serve.loop import LoadFailed, OneLoop

    api_key = args.api_key if args.api_key is not None else (os.environ.get(API_KEY_ENV) or None)
    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key is empty: give it a key, or leave it out to serve without one")
    config = load_config(getattr(args, "config", None))
    spec = config.get(getattr(args, "model", None))
    model_path = spec.resolve_file()
    sock = bind(args.bind, args.port)

    one = OneLoop(queue_limit=args.queue) if args.parallel == 1 else BatchLoop(args.queue, args.parallel)
    draft_model = getattr(args, "draft_model", None) or config.draft_path(spec)
    options = EngineOptions.from_spec(spec, model_path, draft_model=draft_model, **_engine_overrides(args))
    try:
        with _sigterm_as_interrupt():
            ready = one.load(options, spec.name, str(model_path))
    except LoadFailed as exc:
        sock.close()
        one.close()
        raise UsageError(str(exc)) from None
    except KeyboardInterrupt:
        sock.close()
        one.close()
        print("loopchat serve: stopped while the model was loading", file=sys.stderr)
        return 0

    model = _served_model(spec, model_path, ready, args.strict_model)
    embedder = Embedder(model_path, options.threads if isinstance(options.threads, int) else physical_cores())
    app = with_cors(create_app(one, model, api_key=api_key, log=_log, embedder=embedder), args.cors_origin, _log)
    url = socket_url(sock)
    threads = f"threads {options.threads}"
    if options.threads in (None, "auto"):  # one engine, one tuner for every request: what it chose at load
        threads = f"threads auto: {ready.threads_reason}"

    def listening() -> None:
        _keep_startup_objects()
        print(
            f"loopchat serve: listening on {url} · OpenAI base_url {url}/v1 · model {model.id} · "
            f"{threads} · queue {args.queue} · parallel {args.parallel} · "
            f"{'API key required' if api_key else 'no API key'} · Ctrl+C stops",
            flush=True,
        )

    def on_signal() -> None:  # (the generation and the embeddings in flight end at once)
        one.stop()
        embedder.stop_all()

    server = _server(_uvicorn_config(app), on_listening=listening, on_signal=on_signal)
    try:
        server.run(sockets=[sock])
    finally:
        embedder.close()
        one.close()
        sock.close()
    why = f" ({signal.Signals(server.signal).name})" if server.signal else ""
    print(f"loopchat serve: stopped{why} after {one.runs} generations; the model is closed", file=sys.stderr)
    return 0


def _uvicorn_config(app: Any) -> uvicorn.Config:
    import uvicorn

    from loopchat.serve.http_stack import event_loop, http_implementation

    return uvicorn.Config(
        app,
        http=http_implementation(),
        loop=event_loop(),
        ws="none",
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,
        server_header=False,
    )


def _served_model(spec: Any, model_path: Path, ready: Any, strict: bool) -> ServedModel:
    """The model as /v1/models names it (a models.toml entry's name, or a --model file's)."""
    from loopchat.serve.served_model import ServedModel

    assert ready.n_ctx is not None and ready.n_vocab is not None  # a local model gives both (a remote one may not)
    return ServedModel(
        id=Path(model_path).name if spec.from_command_line else spec.name,
        file_name=Path(model_path).name,
        n_ctx=ready.n_ctx,
        n_vocab=ready.n_vocab,
        sampling=spec.sampling,
        strict=strict,
    )


def _keep_startup_objects() -> None:
    """Everything made before the server listens (the model's Python side, the app, uvicorn, the
    imports: ~54,000 objects) lives as long as the server: out of the cycle collector's sight. A
    full collection (rare: once a quarter as many objects again have survived) would scan them all,
    ~15-20 ms on whichever thread allocates, a token held up that long; the young collections while
    serving came 4 times in 8 requests, not 17 (docs/performance.md, "`loopchat serve`'s token on
    both threads")."""
    gc.freeze()


class _SignalledServer(Protocol):
    """What serve_command uses of the Server `_server` makes."""

    signal: int  # the first signal received (0: none)

    def run(self, sockets: list[socket.socket] | None = None) -> None: ...


def _server(
    config: uvicorn.Config, *, on_listening: Callable[[], None], on_signal: Callable[[], None]
) -> _SignalledServer:
    """uvicorn's Server, told when it listens, cancelling the loop at the first signal,
    and not re-raising the signal after the shutdown (uvicorn does, so that the default
    handler runs: a KeyboardInterrupt traceback and exit code 130 after a clean stop)."""
    import uvicorn

    class Server(uvicorn.Server):
        signal = 0  # the first signal received

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                on_listening()

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not self.signal:
                self.signal = sig
                on_signal()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            handled = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server(config)
