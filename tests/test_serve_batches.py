"""OpenAI's Batch API and the Files API under it, on `loopchat serve` (serve/batches_api.py,
serve/files_api.py): the batch guide's code with the Python SDK against a real server (its API key
set, as the batch's own requests must pass it too): a file of requests uploaded, the batch run by the
server, its output and error files downloaded; a file that is not one, refused line by line; a batch
cancelled, its running requests stopped. Each batch's end is awaited on the server's log line."""

from __future__ import annotations

import json
import re
import time
import warnings
from collections.abc import Iterator

import httpx
import openai
import pytest
from serve_process import KEY, NODE_MISSING, SERVED, Serve, auth, node_json, tiny_server

pytestmark = [pytest.mark.model, pytest.mark.server]

HELLO = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello world!"}]
COLOUR = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    with tiny_server(tmp_path_factory.mktemp("serve-batches")) as s:
        yield s


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _line(custom_id: str, body: dict, url: str = "/v1/chat/completions") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def _steps(body: dict) -> list[dict]:
    return [e for e in body["loopchat"]["events"] if e["kind"] == "step"]


def _alone(server: Serve, messages: list[dict], n: int) -> dict:
    """The reply a client gets alone, its prompt evaluated whole (its steps in the extension)."""
    body = {"messages": messages, "max_tokens": n, "cache_prompt": False}
    r = httpx.post(server.url + "/v1/chat/completions", headers=auth(), json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _same_or_near_tie(alone: dict, batched: dict) -> None:
    """The batch's reply is the one a client gets alone; or, where their tokens part, the two tokens
    are the two best of both steps, within 0.1 of each other (a batch's prefill and passes round in
    other orders: tests/test_serve_parallel.py's rule), named as a warning."""
    a, b = _steps(alone), _steps(batched)
    if [x["token_id"] for x in a] == [x["token_id"] for x in b]:
        assert batched["choices"][0]["message"]["content"] == alone["choices"][0]["message"]["content"]
        return
    i = next(i for i, (x, y) in enumerate(zip(a, b)) if x["token_id"] != y["token_id"])
    for step, other in ((a[i], b[i]["token_id"]), (b[i], a[i]["token_id"])):
        probs = {c[0]: c[2] for c in step["raw_top"]}
        assert [c[0] for c in step["raw_top"][:2]] == [step["token_id"], other], (i, a[i]["raw_top"], b[i]["raw_top"])
        assert probs[step["token_id"]] - probs[other] < 0.1, (i, a[i]["raw_top"], b[i]["raw_top"])
    warnings.warn(f"a batch's rounding flipped a near-tie at step {i}", stacklevel=2)


def _ended(server: Serve, batch_id: str, start: int) -> re.Match:
    return server.wait_for(rf"batch {batch_id} (\w+) · (\d+) of (\d+) requests run", start=start, timeout=120)


def test_the_batch_guide_runs_unchanged(server: Serve, tmp_path) -> None:  # noqa: ANN001
    """Upload (purpose batch), create, retrieve until done, download: each request's response as a
    client's request gets it (the same reply), with its custom_id, in the input's order; a request
    the server refuses is in the error file with its 400; the files are listed, read and deleted."""
    client = server.client(KEY)
    path = tmp_path / "batchinput.jsonl"
    path.write_bytes(
        _jsonl(
            [
                _line("request-1", {"model": "gpt-4o-mini", "messages": HELLO, "max_tokens": 12}),
                _line("request-2", {"model": "gpt-4o-mini", "messages": COLOUR, "max_tokens": 6, "stream": True}),
                _line("request-3", {"model": "gpt-4o-mini", "messages": COLOUR, "logprobs": True, "top_logprobs": 50}),
            ]
        )
    )
    mark = len(server.err)
    batch_input_file = client.files.create(file=open(path, "rb"), purpose="batch")  # noqa: SIM115 (the guide's)
    assert batch_input_file.bytes == path.stat().st_size and batch_input_file.purpose == "batch"
    batch = client.batches.create(
        input_file_id=batch_input_file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"description": "nightly eval job"},
    )
    assert batch.id.startswith("batch_") and batch.metadata == {"description": "nightly eval job"}
    assert _ended(server, batch.id, mark).groups() == ("completed", "3", "3")
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in out] == ["request-1", "request-2"]
    for o, messages, n in ((out[0], HELLO, 12), (out[1], COLOUR, 6)):
        body = o["response"]["body"]
        assert o["response"]["status_code"] == 200 and o["error"] is None and body["model"] == SERVED
        _same_or_near_tie(_alone(server, messages, n), body)
        server.wait_for(rf"POST /v1/chat/completions 200 · blocking · .* · {o['response']['request_id']}$", start=mark)
    (err,) = [json.loads(x) for x in client.files.content(batch.error_file_id).text.splitlines()]
    assert err["custom_id"] == "request-3" and err["response"]["status_code"] == 400
    assert err["response"]["body"]["error"]["param"] == "top_logprobs"
    assert batch.id in [b.id for b in client.batches.list(limit=5)]
    names = {f.id: f.filename for f in client.files.list()}
    assert names[batch_input_file.id] == "batchinput.jsonl" and names[batch.output_file_id].endswith("_output.jsonl")
    assert client.files.content(batch_input_file.id).content == path.read_bytes()
    client.files.delete(batch_input_file.id)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(batch_input_file.id)


def test_a_file_that_is_not_requests_fails_the_batch_line_by_line(server: Serve) -> None:
    client = server.client(KEY)
    rows = _jsonl([{**_line("a", {}), "method": "GET"}, _line("b", {"input": "x"}, url="/v1/embeddings")])
    bad = client.files.create(file=("bad.jsonl", rows + b"not json\n"), purpose="batch")
    mark = len(server.err)
    batch = client.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h")
    server.wait_for(rf"batch {batch.id} failed · 3 lines refused", start=mark)
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "failed" and [e.line for e in batch.errors.data] == [1, 2, 3]
    assert "method must be POST" in batch.errors.data[0].message and "url must be" in batch.errors.data[1].message
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError) as info:
        client.batches.create(input_file_id=bad.id, endpoint="/v1/images/generations", completion_window="24h")
    assert info.value.param == "endpoint"


def test_a_cancelled_batch_stops_its_running_requests(server: Serve) -> None:
    """Cancel: the batch ends "cancelled", the requests it was running stop (499, finish cancelled),
    the others are not run; the server generates nothing more."""
    client = server.client(KEY)
    story = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 400}
    f = client.files.create(file=("many.jsonl", _jsonl([_line(f"r{i}", story) for i in range(8)])), purpose="batch")
    mark = len(server.err)
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 60  # (until the batch's requests are generating: the server's own state)
    while not httpx.get(server.url + "/health", timeout=10).json()["generating"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = _ended(server, batch.id, mark)
    assert done.group(1) == "cancelled" and int(done.group(2)) < 8
    assert client.batches.retrieve(batch.id).status == "cancelled"
    server.wait_for(r"POST /v1/chat/completions 499 · blocking .*finish: cancelled", start=mark, timeout=60)


@pytest.mark.skipif(NODE_MISSING is not None, reason=NODE_MISSING or "")
def test_the_node_sdk_runs_the_batch_guide(server: Serve) -> None:
    got = node_json(server, "batch.mjs")
    assert got["status"] == "completed" and got["counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert [c for c, _ in got["replies"]] == ["request-a", "request-b"], got
    # (the same prompt twice, in one batch: the same reply, whatever the batch's rounding did to both)
    assert got["replies"][0][1] == got["replies"][1][1] and got["replies"][0][1], got
