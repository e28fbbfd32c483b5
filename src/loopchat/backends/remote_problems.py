"""The one line a failed request to a server gives (remote.py): what went wrong, and
what to do about it."""

from __future__ import annotations

import json

from loopchat.backends.wire_parts import error_message
from loopchat.errors import one_line

#: Seconds to wait for a connection (at most; the backend's timeout when shorter).
CONNECT_TIMEOUT = 10.0


def shorten(text: str, limit: int = 80) -> str:
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def status_problem(base: str, code: int, reason: str, text: str) -> str:
    """The one line for an HTTP error status (its body's error message when it has one)."""
    detail = None
    try:
        detail = error_message(json.loads(text))
    except ValueError:
        pass
    if detail is None:
        detail = text.strip().splitlines()[0] if text.strip() else ""
    what = f"{code} {reason}".strip() + (f" ({shorten(one_line(detail), 200)})" if detail else "")
    if code in (401, 403):
        fix = "pass the server's API key with --api-key (or api_key_env in models.toml)"
    elif code == 404:
        fix = f"check the URL (an OpenAI-compatible API's usually ends in /v1) and the model id ({base}/models lists them)"
    elif code == 429:
        fix = "the server is busy: try again in a moment"
    elif code >= 500:
        fix = "the server failed: its log may say why; try again"
    else:
        fix = "the server refused the request"
    return f"{base} answered {what}: {fix}"


def transport_problem(base: str, timeout: float, exc: Exception, chunks: int | None, blocking: bool) -> str:
    """The one line for a connection that failed, timed out or broke (`chunks`: received before)."""
    import httpx

    t = f"{timeout:g}"
    if isinstance(exc, httpx.ConnectTimeout):
        return f"{base} did not accept a connection within {min(CONNECT_TIMEOUT, timeout):g} s: check the URL and that the server is running"
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect to {base} ({one_line(str(exc)) or type(exc).__name__}): check the URL and that the server is running"
    if isinstance(exc, httpx.TimeoutException):
        if chunks:
            return (
                f"{base} sent nothing for {t} s mid-reply (after {chunks} chunks): the server may be stuck or "
                "overloaded; raise the timeout (--timeout, or timeout in models.toml) to wait longer"
            )
        whole = " (in blocking mode the whole reply must arrive within it)" if blocking else ""
        return (
            f"{base} sent no answer within {t} s{whole}: raise the timeout (--timeout, or timeout in "
            "models.toml) to wait longer"
        )
    detail = one_line(str(exc)) or type(exc).__name__
    if chunks:
        return (
            f"the connection to {base} broke mid-reply (after {chunks} chunks, before data: [DONE]): {detail}; "
            "the server may have stopped or restarted"
        )
    return f"the connection to {base} failed ({detail}): the server may have stopped or restarted; try again"
