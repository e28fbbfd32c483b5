"""`loopchat serve`: which web pages may call the server from a browser (CORS).

A page's script in a browser may read a response from another origin only if that
response names the page's origin (`Access-Control-Allow-Origin`), and for a JSON POST
the browser first asks with a preflight (`OPTIONS` with `Origin` and
`Access-Control-Request-Method`). Starlette's CORSMiddleware answers both.

Which origins (`--cors-origin`, repeatable):
- by default, pages served from this machine: `http(s)://localhost`, `127.0.0.1` and
  `[::1]`, any port (a web UI under development, a local notebook). Anything on this
  machine can reach the port directly anyway, so this gives no one new access, while a
  page from the internet cannot use your model (nor read what it writes) just because
  it is open in your browser;
- `--cors-origin https://app.example` (scheme://host[:port]) adds that origin instead;
  `*` lets every page call (a public demo), `none` answers no preflight at all.

A request from a browser page whose origin is not allowed is refused with 403 before
anything runs: a form or a `text/plain` POST needs no preflight, and without this a page
elsewhere could start generations it cannot read. Clients that are not browsers send
no `Origin` and are not affected.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (Starlette is imported when the server starts, not for the command line's parser)
    from starlette.types import ASGIApp, Receive, Scope, Send

#: The default: pages served from this machine, any port.
LOCAL_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"
ANY, NONE = "*", "none"
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s?#]+")


def cors_origin(text: str) -> str:
    """argparse type of --cors-origin: an origin (scheme://host[:port]), `*` or `none`."""
    value = text.strip().rstrip("/")
    if value in (ANY, NONE) or _ORIGIN.fullmatch(value.lower()):
        return value.lower() if value != ANY else value
    raise argparse.ArgumentTypeError(
        f"{text!r} is not an origin: give scheme://host[:port] as a browser sends it (e.g. "
        "http://localhost:5173), * for every origin, or none"
    )


def describe(origins: Sequence[str] | None) -> str:
    """What the start-up help and errors say about the origins allowed."""
    if not origins:
        return "pages on this machine (localhost, 127.0.0.1, [::1])"
    if NONE in origins:
        return "no web page"
    return "every web page" if ANY in origins else ", ".join(origins)


class ServeCORS:
    """Starlette's CORSMiddleware, and a 403 for a browser request from an origin not allowed."""

    def __init__(self, app: ASGIApp, origins: Sequence[str] | None, log: Callable[[str], None] | None = None) -> None:
        from starlette.middleware.cors import CORSMiddleware

        listed = [] if NONE in (origins or ()) else list(origins or ())
        self.cors = CORSMiddleware(
            app,
            allow_origins=listed,
            allow_origin_regex=None if origins else LOCAL_ORIGINS,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],  # OpenAI's browser SDK sends x-stainless-* headers besides these
            expose_headers=["Retry-After"],
            max_age=600,
        )
        self.origins = origins
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            origin = dict(scope["headers"]).get(b"origin")
            if origin is not None and not self.cors.is_allowed_origin(origin.decode("latin-1")):
                await self._refuse(origin.decode("latin-1"), scope, receive, send)
                return
        await self.cors(scope, receive, send)

    async def _refuse(self, origin: str, scope: Scope, receive: Receive, send: Send) -> None:
        from starlette.responses import JSONResponse

        from loopchat.wire import error_body

        message = (
            f"this server does not take requests from web pages at {origin} (it takes them from "
            f"{describe(self.origins)}): start loopchat serve with --cors-origin {origin}"
        )
        if self.log is not None:
            client = scope.get("client") or ("-",)
            self.log(f"{client[0]} {scope['method']} {scope['path']} 403 · {message}")
        await JSONResponse(error_body(message, code="origin_not_allowed"), status_code=403)(scope, receive, send)


def with_cors(app: ASGIApp, origins: Sequence[str] | None, log: Callable[[str], None] | None = None) -> ASGIApp:
    """`app` behind the CORS rules of --cors-origin (None or []: this machine's pages);
    `log` gets one line per request refused."""
    return ServeCORS(app, origins, log)
