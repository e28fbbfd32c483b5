"""OpenAI's Batch API on `loopchat serve`: a file of requests (serve/files_api.py) run by the server,
their responses written to a file the client downloads, as OpenAI's batch guide does it.

- `POST /v1/batches` (`input_file_id`, `endpoint`: /v1/chat/completions, /v1/completions,
  /v1/responses or /v1/embeddings; `completion_window`, `metadata`): the batch's object, `batch_`
  and 24 hex digits. Its lines are checked first (each a JSON object with a unique `custom_id`,
  `method` POST, `url` the batch's endpoint and a `body` object): one line that is not, and the batch
  is "failed" with an error per such line (`errors`), as OpenAI's validation fails it.
- Then "in_progress": each line's body is sent to the endpoint inside the server (the same parsing,
  errors, log line and `loopchat` records as a client's request; never streamed), up to `AT_ONCE` at
  a time (they share passes as concurrent requests do), and "completed": the responses of status 2xx
  in the output file, the others in the error file, each line `{"id", "custom_id", "response":
  {"status_code", "request_id", "body"}, "error"}`, in the input's order; `request_counts`.
- `GET /v1/batches/{id}`, `GET /v1/batches` (newest first: `limit`, `after`), `POST
  /v1/batches/{id}/cancel` ("cancelling", then "cancelled": the lines not done are not run, those done
  are in the files).

In memory, in the server's event loop, the latest `KEEP` batches; a batch still running when the
server stops is cancelled.
"""

from __future__ import annotations

import asyncio
import functools
import json
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loopchat.serve.files_api import FileStore
from loopchat.serve.kept import not_kept, page, routes
from loopchat.serve.request_error import RequestError
from loopchat.serve.requests import parse_json

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import ASGIApp

KEEP = 64
#: how many of a batch's requests are sent at once
AT_ONCE = 4
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings")


class BatchStore:
    def __init__(self, files: FileStore, api_key: str | None, log: Callable[[str], None]) -> None:
        self.files, self.api_key, self.log = files, api_key, log
        self.app: ASGIApp | None = None  # (the application itself: set at its start)
        self._kept: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        endpoint, fid = body.get("endpoint"), body.get("input_file_id")
        if endpoint not in ENDPOINTS:
            raise RequestError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}", param="endpoint")
        if not isinstance(fid, str):
            raise RequestError("input_file_id is required: a file uploaded with purpose batch", param="input_file_id")
        data = self.files.get(fid).data
        batch = {
            "id": f"batch_{secrets.token_hex(12)}",
            "object": "batch",
            "endpoint": endpoint,
            "errors": None,
            "input_file_id": fid,
            "completion_window": body.get("completion_window") or "24h",
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": int(time.time()),
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": body.get("metadata"),
        }
        self._kept[batch["id"]] = batch
        while len(self._kept) > KEEP:  # (the oldest forgotten; a batch still running goes on)
            self._kept.popitem(last=False)
        for done in [bid for bid, task in self._tasks.items() if task.done()]:
            del self._tasks[done]
        self._tasks[batch["id"]] = asyncio.get_running_loop().create_task(self._run(batch, data))
        return batch

    def listed(self) -> list[dict[str, Any]]:
        """The kept batches, newest first."""
        return list(reversed(self._kept.values()))

    def get(self, batch_id: str) -> dict[str, Any]:
        batch = self._kept.get(batch_id)
        if batch is None:
            raise not_kept("batch", batch_id, KEEP, "batch_id")
        return batch

    def cancel(self, batch_id: str) -> dict[str, Any]:
        batch, task = self.get(batch_id), self._tasks.get(batch_id)
        if task is not None and not task.done():
            batch["status"], batch["cancelling_at"] = "cancelling", int(time.time())
            task.cancel()
        return batch

    async def close(self) -> None:
        """The batches still running cancelled (the server stops), their ends awaited (5 s at most)."""
        running = [task for task in self._tasks.values() if not task.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=5.0)

    # ---- running a batch --------------------------------------------------------------
    async def _run(self, batch: dict[str, Any], data: bytes) -> None:
        lines, errors = _lines(data, batch["endpoint"])
        batch["request_counts"]["total"] = len(lines)
        if errors or not lines:
            batch["status"], batch["failed_at"] = "failed", int(time.time())
            errors = errors or [{"code": "empty_file", "line": None, "message": "the input file holds no request"}]
            batch["errors"] = {"object": "list", "data": errors[:100]}
            self.log(f"batch {batch['id']} failed · {len(errors)} lines refused: {errors[0]['message']}")
            return
        batch["status"], batch["in_progress_at"] = "in_progress", int(time.time())
        results: list[dict[str, Any] | None] = [None] * len(lines)
        try:
            import httpx

            transport = httpx.ASGITransport(app=self.app)  # type: ignore[arg-type]
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            async with httpx.AsyncClient(transport=transport, base_url="http://batch", timeout=None) as client:
                gate = asyncio.Semaphore(AT_ONCE)

                async def one(i: int, line: dict[str, Any]) -> None:
                    async with gate:
                        results[i] = await _send(client, headers, line, batch)

                await asyncio.gather(*(one(i, line) for i, line in enumerate(lines)))
            batch["status"] = "completed"
        except asyncio.CancelledError:
            batch["status"] = "cancelled"
        self._finish(batch, [r for r in results if r is not None])

    def _finish(self, batch: dict[str, Any], results: list[dict[str, Any]]) -> None:
        now, done = int(time.time()), batch["status"]
        batch["finalizing_at"] = batch[f"{done}_at"] = now
        ok: list[dict[str, Any]] = []
        bad: list[dict[str, Any]] = []
        for r in results:
            (ok if r["error"] is None and 200 <= r["response"]["status_code"] < 300 else bad).append(r)
        batch["request_counts"].update(completed=len(ok), failed=len(bad))
        name = batch["id"]
        if ok:
            batch["output_file_id"] = self.files.put(_jsonl(ok), f"{name}_output.jsonl", "batch_output")["id"]
        if bad:
            batch["error_file_id"] = self.files.put(_jsonl(bad), f"{name}_error.jsonl", "batch_output")["id"]
        self.log(
            f"batch {name} {done} · {len(results)} of {batch['request_counts']['total']} requests run · "
            f"{len(ok)} completed, {len(bad)} failed"
        )


async def _send(client: Any, headers: dict[str, str], line: dict[str, Any], batch: dict[str, Any]) -> dict[str, Any]:
    """One line's request inside the server: its result line."""
    body = {**line["body"], "stream": False} if batch["endpoint"] != "/v1/embeddings" else line["body"]
    out: dict[str, Any] = {"id": f"batch_req_{secrets.token_hex(12)}", "custom_id": line["custom_id"]}
    try:
        r = await client.post(line["url"], json=body, headers=headers)
        try:
            answer = r.json()
        except ValueError:
            answer = {"error": {"message": r.text, "type": "server_error"}}
        out["response"] = {"status_code": r.status_code, "request_id": r.headers.get("x-request-id"), "body": answer}
        out["error"] = None
    except Exception as exc:  # noqa: BLE001 (a line's failure is its line's error, not the batch's)
        out["response"], out["error"] = None, {"code": "server_error", "message": str(exc) or type(exc).__name__}
    return out


def _lines(data: bytes, endpoint: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The input file's requests, and an error per line that is not one (its 1-based line number)."""
    lines: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, raw in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError as exc:
            errors.append(_line_error(n, f"line {n} is not valid JSON ({exc})"))
            continue
        problem = _problem(line, endpoint, seen)
        if problem is not None:
            errors.append(_line_error(n, f"line {n}: {problem}"))
            continue
        seen.add(line["custom_id"])
        lines.append(line)
    return lines, errors


def _problem(line: Any, endpoint: str, seen: set[str]) -> str | None:
    if not isinstance(line, dict):
        return "each line must be a JSON object"
    cid = line.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return "custom_id is required (a string)"
    if cid in seen:
        return f"custom_id {cid!r} is not unique"
    if line.get("method") != "POST":
        return f"method must be POST, got {line.get('method')!r}"
    if line.get("url") != endpoint:
        return f"url must be the batch's endpoint {endpoint}, got {line.get('url')!r}"
    if not isinstance(line.get("body"), dict):
        return "body must be a JSON object (the request)"
    return None


def _line_error(n: int, message: str) -> dict[str, Any]:
    return {"code": "invalid_request", "line": n, "message": message, "param": None}


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def batch_routes(store: BatchStore, denied: Callable[[Request], Response | None]) -> list[Any]:
    """The Batch API's Starlette routes over `store` (`denied`: the API key's check)."""
    table: list[tuple[str, list[str], dict[str, Any]]] = [
        ("/v1/batches", ["GET", "POST"], {}),
        ("/v1/batches/{batch_id}", ["GET"], {}),
        ("/v1/batches/{batch_id}/cancel", ["POST"], {}),
    ]
    return routes(denied, functools.partial(_answer, store=store), table)


async def _answer(request: Request, store: BatchStore) -> dict[str, Any]:
    bid = request.path_params.get("batch_id")
    if bid is None and request.method == "POST":
        return store.create(parse_json(await request.body()))
    if bid is None:  # (newest first; an `after` not kept: an empty page)
        return page(store.listed(), request.query_params, None)
    if request.url.path.endswith("/cancel"):
        return store.cancel(bid)
    return store.get(bid)
