"""`loopchat serve`'s HTTP stack under Starlette: uvicorn's C parts when installed.

uvicorn runs on either of two HTTP implementations and two event loops: h11 (pure Python)
or httptools (llhttp, C), asyncio's own loop or uvloop (libuv, C). The C ones are
loopchat's dependencies (pyproject.toml) and chosen here when they import; without them
(a platform they have no wheel for) the pure-Python ones serve the very same bytes.

What they change, per streamed token (docs/performance.md, "`loopchat serve` against
llama-server on equal terms"): the chunk's way from `send` to the socket (h11's event
machinery against httptools' protocol's few lines), and the event loop's own work: the
hand-off thread's wake-up, the callbacks, the socket's write (~0.05 ms of the event loop's
~0.3 ms a token).
"""

from __future__ import annotations

import importlib.util


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def http_implementation() -> str:
    """uvicorn's `http`: "httptools" when installed, else "h11"."""
    return "httptools" if _installed("httptools") else "h11"


def event_loop() -> str:
    """uvicorn's `loop`: "uvloop" when installed, else "asyncio"."""
    return "uvloop" if _installed("uvloop") else "asyncio"
