"""OpenAI's Conversations API on `loopchat serve`: a conversation is a list of Responses items that
`POST /v1/responses` with `conversation` continues and adds to.

- `POST /v1/conversations` (`items`, `metadata`): a new conversation, `conv_` and 48 hex digits;
  `GET`, `POST` (new `metadata`) and `DELETE /v1/conversations/{id}`.
- `GET /v1/conversations/{id}/items` (`limit` 1-100, default 20; `order` "desc", the default, or
  "asc"; `after` an item's id: the page after it), `POST` (`items`: added at the end),
  `GET` and `DELETE /v1/conversations/{id}/items/{item_id}` (the delete answers with the conversation).
- A response with `conversation` (an id, or `{"id": ...}`): the conversation's items come before its
  `input` (as a previous response's do with `previous_response_id`, which it cannot be given with);
  once it has finished, its input items and its output items are added to the conversation, and the
  response object names it (`"conversation": {"id": ...}`).

Items are kept as the API returns them: every one with an `id` (`msg_`, `fc_` or `fco_` and hex
digits where the client gave none); a message's content as parts (a string becomes one
`input_text` part, `output_text` for the assistant's). Only what the Responses endpoint reads is
taken: messages of text, `function_call` and `function_call_output` items. In memory, in the
server's event loop, the latest `KEEP` conversations (the least recently used dropped first):
nothing is written to disk, and nothing outlives the server.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loopchat.serve.kept import listed, not_kept, page, routes
from loopchat.serve.request_error import RequestError
from loopchat.serve.requests import parse_json

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

#: how many conversations a server keeps
KEEP = 256
_PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_"}
_TEXT_PARTS = ("input_text", "output_text", "text")


@dataclass
class Conversation:
    id: str
    created_at: int
    metadata: dict[str, Any]
    items: list[dict[str, Any]] = field(default_factory=list)

    def card(self) -> dict[str, Any]:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at, "metadata": self.metadata}


class ConversationStore:
    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._kept: OrderedDict[str, Conversation] = OrderedDict()

    def create(self, items: list[dict[str, Any]], metadata: dict[str, Any]) -> Conversation:
        conv = Conversation(f"conv_{secrets.token_hex(24)}", int(time.time()), metadata, items)
        self._kept[conv.id] = conv
        while len(self._kept) > self.keep:
            self._kept.popitem(last=False)
        return conv

    def get(self, conversation_id: str) -> Conversation | None:
        conv = self._kept.get(conversation_id)
        if conv is not None:
            self._kept.move_to_end(conversation_id)
        return conv

    def add(self, conversation_id: str, items: list[dict[str, Any]]) -> None:
        """Items added at the end (a conversation deleted meanwhile: nothing)."""
        conv = self._kept.get(conversation_id)
        if conv is not None:
            conv.items.extend(items)

    def delete(self, conversation_id: str) -> bool:
        return self._kept.pop(conversation_id, None) is not None


def items_of(value: Any, where: str) -> list[dict[str, Any]]:
    """Request items as kept: each with an id, a message's content as parts (RequestError: one line)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise RequestError(f"{where} must be a list of items (messages, function calls and their outputs)", param=where)
    return [_item(item, f"{where}[{i}]") for i, item in enumerate(value)]


def _item(item: Any, where: str) -> dict[str, Any]:
    kind = item.get("type", "message") if isinstance(item, dict) else type(item).__name__
    if kind not in _PREFIX:
        raise RequestError(
            f"{where}: only messages, function calls and their outputs are supported, got {kind!r}", param=where
        )
    out = {**item, "type": kind, "id": item.get("id") or _PREFIX[kind] + secrets.token_hex(24)}
    if kind == "message":
        role, content = item.get("role"), item.get("content")
        if role not in ("user", "assistant", "system", "developer"):
            raise RequestError(f"{where}.role must be user, assistant, system or developer, got {role!r}", param=where)
        if isinstance(content, str):
            part = "output_text" if role == "assistant" else "input_text"
            content = [{"type": part, "text": content, **({"annotations": []} if role == "assistant" else {})}]
        if not isinstance(content, list) or not all(is_text_part(part) for part in content):
            raise RequestError(
                f'{where}.content must be a string or a list of text parts ("input_text", "output_text")', param=where
            )
        out["content"] = content
        out.setdefault("status", "completed")
    return out


def is_text_part(part: Any) -> bool:
    """A content part of text ("input_text", "output_text" or "text"): all the server reads."""
    return isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str)


def binding(body: dict[str, Any], store: ConversationStore) -> tuple[str, list[dict[str, Any]]] | None:
    """A /v1/responses body's `conversation`: (its id, its items so far); None: none given. A 404 for
    one not kept, a 400 beside previous_response_id."""
    value = body.get("conversation")
    if value is None:
        return None
    cid = value.get("id") if isinstance(value, dict) else value
    if not isinstance(cid, str):
        raise RequestError('conversation must be a conversation id or {"id": ...}', param="conversation")
    if body.get("previous_response_id") is not None:
        raise RequestError(
            "conversation and previous_response_id cannot be used together: give one of them",
            param="conversation",
            code="invalid_request",
        )
    conv = store.get(cid)
    if conv is None:
        raise _not_kept(cid)
    return cid, list(conv.items)


def _not_kept(cid: str) -> RequestError:
    return not_kept("conversation", cid, KEEP, "conversation", " (POST /v1/conversations makes one)")


def items_page(request: Request, items: list[dict[str, Any]]) -> dict[str, Any]:
    """A page of `items` (oldest first) as GET .../items answers (a response's input items too): `order`
    "desc" (the default) or "asc", then kept.page's `limit` and `after`."""
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise RequestError(f"order must be asc or desc, got {order!r}", param="order")
    seq = items if order == "asc" else items[::-1]
    return page(seq, request.query_params, "in this list")


#: the routes: path, methods, what it names
_ROUTES = (
    ("/v1/conversations", ["POST"], {"what": "all"}),
    ("/v1/conversations/{conversation_id}", ["GET", "POST", "DELETE"], {"what": "one"}),
    ("/v1/conversations/{conversation_id}/items", ["GET", "POST"], {"what": "items"}),
    ("/v1/conversations/{conversation_id}/items/{item_id}", ["GET", "DELETE"], {"what": "item"}),
)


def conversation_routes(store: ConversationStore, denied: Callable[[Request], Response | None]) -> list[Any]:
    """The Conversations API's Starlette routes over `store` (`denied`: the API key's check)."""
    return routes(denied, functools.partial(_answer, store=store), _ROUTES)


async def _answer(request: Request, store: ConversationStore, what: str) -> dict[str, Any]:
    """A /v1/conversations request: `what` the conversations ("all"), one ("one"), its items ("items")
    or one of them ("item")."""
    params, method = request.path_params, request.method
    raw = await request.body() if method == "POST" else b""
    body = parse_json(raw) if raw.strip() else {}
    if what == "all":  # POST /v1/conversations
        return store.create(items_of(body.get("items"), "items"), _metadata(body)).card()
    cid = params["conversation_id"]
    conv = store.get(cid)
    if conv is None:
        raise _not_kept(cid)
    if what == "one":  # the conversation itself
        if method == "DELETE":
            store.delete(cid)
            return {"id": cid, "object": "conversation.deleted", "deleted": True}
        if method == "POST":
            conv.metadata = _metadata(body)
        return conv.card()
    item_id = params.get("item_id")
    if what == "items":
        if method == "POST":
            added = items_of(body.get("items"), "items")
            conv.items.extend(added)
            return listed(added)
        return items_page(request, conv.items)
    at = next((i for i, it in enumerate(conv.items) if it["id"] == item_id), None)
    if at is None:
        raise RequestError(f"no item {item_id!r} in conversation {cid!r}", status=404, param="item_id")
    if method == "DELETE":
        del conv.items[at]
        return conv.card()
    return conv.items[at]


def _metadata(body: dict[str, Any]) -> dict[str, Any]:
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict) or len(metadata) > 16:
        raise RequestError("metadata must be an object of at most 16 keys", param="metadata")
    return metadata
