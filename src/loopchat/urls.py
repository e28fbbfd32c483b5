"""An OpenAI-compatible API's base URL: checked and normalised to end in /v1. A contract:
models.toml's reader (`url = ...`), the command line's --url and the remote backend all
take it from here."""

from __future__ import annotations

from urllib.parse import urlsplit


class URLProblem(ValueError):
    """A URL that cannot be an API's base URL (one-line message)."""


def api_base(url: str) -> str:
    """The API's base URL, ending in /v1: "http://host:8000", "http://host:8000/v1/" and
    "http://host:8000/v1/chat/completions" all give "http://host:8000/v1"."""
    text = url.strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise URLProblem(
            f"{url!r} is not an http:// or https:// URL; give the server's address, e.g. http://127.0.0.1:8000/v1"
        )
    if parts.query or parts.fragment:
        raise URLProblem(
            f"{url!r} has a query or fragment; give the server's base address, e.g. http://127.0.0.1:8000/v1"
        )
    path = parts.path.rstrip("/")
    for tail in ("/chat/completions", "/completions", "/models"):
        if path.endswith(tail):
            path = path[: -len(tail)]
            break
    if not path.endswith("/v1"):
        path += "/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"


__all__ = ["URLProblem", "api_base"]
