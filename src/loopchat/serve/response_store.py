"""The Responses API's stored responses (`store`, true unless a request says false, as OpenAI's):
what `previous_response_id` continues and `GET /v1/responses/{id}` returns.

A stored response keeps its conversation as chat messages (the one it continued, then its own
input, then its output: the reply's text as an assistant message, or its function calls as an
assistant message's tool calls; not its `instructions`, which OpenAI does not carry over either),
its response object, and its request's input items (`GET /v1/responses/{id}/input_items`). In
memory, in the server's event loop, the latest `KEEP` (the oldest dropped first): nothing is
written to disk, and nothing outlives the server.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loopchat.serve.conversations import items_page
from loopchat.serve.kept import not_kept, routes

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

#: how many responses a server keeps
KEEP = 256


Kept = tuple[tuple[dict[str, Any], ...], dict[str, Any], tuple[dict[str, Any], ...]]


class ResponseStore:
    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._kept: OrderedDict[str, Kept] = OrderedDict()

    def put(
        self,
        response_id: str,
        conversation: tuple[dict[str, Any], ...],
        response: dict[str, Any],
        inputs: tuple[dict[str, Any], ...] = (),
    ) -> None:
        """A response kept: the conversation up to and with it (chat messages), its object, its input items."""
        self._kept[response_id] = (conversation, response, inputs)
        self._kept.move_to_end(response_id)
        while len(self._kept) > self.keep:
            self._kept.popitem(last=False)

    def conversation(self, response_id: str) -> tuple[dict[str, Any], ...] | None:
        """The chat messages of the conversation up to and with this response (None: not kept)."""
        kept = self._kept.get(response_id)
        return None if kept is None else kept[0]

    def response(self, response_id: str) -> dict[str, Any] | None:
        kept = self._kept.get(response_id)
        return None if kept is None else kept[1]

    def inputs(self, response_id: str) -> list[dict[str, Any]]:
        """Its input items (those its request gave: not a previous response's, nor its instructions)."""
        kept = self._kept.get(response_id)
        return [] if kept is None else list(kept[2])

    def delete(self, response_id: str) -> bool:
        return self._kept.pop(response_id, None) is not None


def output_messages(text: str, calls: list[dict[str, Any]] | None) -> tuple[dict[str, Any], ...]:
    """A reply as the chat messages a later request reads: its text, or its tool calls."""
    if calls:
        return ({"role": "assistant", "content": None, "tool_calls": calls},)
    return ({"role": "assistant", "content": text},)


def input_items_routes(store: ResponseStore, denied: Callable[[Request], Response | None]) -> list[Any]:
    """GET /v1/responses/{id}/input_items: a kept response's input items, a page as a conversation's."""

    async def answer(request: Request) -> dict[str, Any]:
        rid = request.path_params["response_id"]
        if store.response(rid) is None:
            raise not_kept("response", rid, store.keep, "response_id")
        return items_page(request, store.inputs(rid))

    return routes(denied, answer, [("/v1/responses/{response_id}/input_items", ["GET"], {})])
