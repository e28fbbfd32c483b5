"""OpenAI's Files API on `loopchat serve`, for its Batch API (serve/batches_api.py): a batch's input
is an uploaded file of JSON lines, its output and errors files the client downloads.

- `POST /v1/files` (multipart: `file`, `purpose`): the file kept, its object returned (`file-` and 24
  hex digits; `status` "processed");
- `GET /v1/files` (every kept file, newest first; `purpose` filters), `GET /v1/files/{id}` (its
  object), `GET /v1/files/{id}/content` (its bytes), `DELETE /v1/files/{id}`.

In memory only, in the server's event loop: at most `MAX_BYTES` a file and `KEEP` files (the oldest
dropped first); nothing is written to disk, and nothing outlives the server.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loopchat.serve.kept import not_kept, routes
from loopchat.serve.request_error import RequestError

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

#: how many files a server keeps, and how large one may be
KEEP = 64
MAX_BYTES = 64 * 1024 * 1024


@dataclass
class KeptFile:
    card: dict[str, Any]
    data: bytes


class FileStore:
    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._kept: OrderedDict[str, KeptFile] = OrderedDict()

    def put(self, data: bytes, filename: str, purpose: str) -> dict[str, Any]:
        """A file kept: its object."""
        fid = f"file-{secrets.token_hex(12)}"
        card = {
            "id": fid,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }
        self._kept[fid] = KeptFile(card, data)
        while len(self._kept) > self.keep:
            self._kept.popitem(last=False)
        return card

    def get(self, file_id: str) -> KeptFile:
        """A kept file (RequestError 404: not kept)."""
        kept = self._kept.get(file_id)
        if kept is None:
            raise not_kept("file", file_id, KEEP, "file_id")
        return kept

    def cards(self, purpose: str | None) -> list[dict[str, Any]]:
        return [k.card for k in reversed(self._kept.values()) if purpose is None or k.card["purpose"] == purpose]

    def delete(self, file_id: str) -> None:
        self.get(file_id)
        del self._kept[file_id]


def file_routes(store: FileStore, denied: Callable[[Request], Response | None]) -> list[Any]:
    """The Files API's Starlette routes over `store` (`denied`: the API key's check)."""
    table: list[tuple[str, list[str], dict[str, Any]]] = [
        ("/v1/files", ["GET", "POST"], {}),
        ("/v1/files/{file_id}", ["GET", "DELETE"], {}),
        ("/v1/files/{file_id}/content", ["GET"], {}),
    ]
    return routes(denied, functools.partial(_answer, store=store), table)


async def _answer(request: Request, store: FileStore) -> dict[str, Any] | Response:
    from starlette.responses import Response as Raw

    fid = request.path_params.get("file_id")
    if fid is None:
        if request.method == "POST":
            return await _upload(request, store)
        return {"object": "list", "data": store.cards(request.query_params.get("purpose")), "has_more": False}
    kept = store.get(fid)
    if request.method == "DELETE":
        store.delete(fid)
        return {"id": fid, "object": "file", "deleted": True}
    if request.url.path.endswith("/content"):
        return Raw(kept.data, media_type="application/octet-stream")
    return kept.card


async def _upload(request: Request, store: FileStore) -> dict[str, Any]:
    try:
        form = await request.form(max_part_size=MAX_BYTES)
    except Exception as exc:  # (Starlette's MultiPartException, or a body that is not a form)
        raise RequestError(f"POST /v1/files takes a multipart form with file and purpose: {exc}") from None
    upload, purpose = form.get("file"), form.get("purpose")
    if not isinstance(purpose, str) or not purpose:
        raise RequestError("purpose is required (batch, for the Batch API's input)", param="purpose")
    if upload is None or isinstance(upload, str):
        raise RequestError("file is required: the file's bytes as a multipart file part", param="file")
    data = await upload.read()
    if len(data) > MAX_BYTES:
        raise RequestError(f"the file holds {len(data)} bytes: at most {MAX_BYTES} here", param="file")
    return store.put(data, upload.filename or "upload", purpose)
