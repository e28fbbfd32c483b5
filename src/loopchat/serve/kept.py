"""What `loopchat serve`'s stateful APIs share (conversations.py, files_api.py, batches_api.py:
objects kept in memory): their routes behind the API key, their refusals as OpenAI's error
object, the 404 for an object not kept, and a page of a list as OpenAI's list object."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from loopchat.serve.request_error import RequestError

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

#: an API's answer to a request: an object (sent as JSON), or a response of its own
Answer = Callable[..., Awaitable["dict[str, Any] | Response"]]


def routes(
    denied: Callable[[Request], Response | None], answer: Answer, table: Sequence[tuple[str, list[str], dict[str, Any]]]
) -> list[Any]:
    """Starlette routes (path, methods, keywords for `answer`) over `answer(request, **keywords)`,
    behind the API key's check (`denied`); a RequestError it raises is answered as OpenAI's error."""
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def route(request: Request, **keywords: Any) -> Response:
        refusal = denied(request)
        if refusal is not None:
            return refusal
        try:
            out = await answer(request, **keywords)
        except RequestError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        return out if isinstance(out, Response) else JSONResponse(out)

    return [Route(path, functools.partial(route, **keywords), methods=methods) for path, methods, keywords in table]


def not_kept(what: str, ident: str, keep: int, param: str, hint: str = "") -> RequestError:
    """The 404 for a `what` (conversation, file, batch) this server does not keep, its code `<what>_not_found`."""
    return RequestError(
        f"{what} {ident!r} is not kept here: this server keeps its latest {keep} {what}s in memory{hint}",
        status=404,
        param=param,
        code=f"{what}_not_found",
    )


def page(seq: list[dict[str, Any]], query: Any, within: str | None) -> dict[str, Any]:
    """A page of `seq` (in the order listed) as OpenAI's list object: `limit` (1-100, default 20) from
    the one after `after`; an `after` not in seq is a 400 naming `within` (None: an empty page)."""
    try:
        limit = int(query.get("limit", 20))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise RequestError("limit must be a whole number from 1 to 100", param="limit")
    after = query.get("after")
    if after is not None:
        at = next((i for i, item in enumerate(seq) if item["id"] == after), None)
        if at is None and within is not None:
            raise RequestError(f"after: no item {after!r} {within}", param="after")
        seq = seq[at + 1 :] if at is not None else []
    return listed(seq[:limit], len(seq) > limit)


def listed(data: list[dict[str, Any]], more: bool = False) -> dict[str, Any]:
    """OpenAI's list object of `data` (`has_more`: `more`)."""
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": more}
