"""`loopchat serve`'s per-token cost (issue 25, item 0, eighth session): the HTTP stack's C parts
(serve/http_stack.py: httptools, uvloop), and a request without the `loopchat` extension asking
the engine for its top_logprobs only."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from serve_process import KEY, Serve

from loopchat.events import Step
from loopchat.serve.requests import MIN_REPORT, parse_chat
from loopchat.settings import SamplingSettings
from loopchat.wire import extension_events

MESSAGES = [{"role": "user", "content": "Name three colours."}]


def test_without_the_extension_the_engine_reports_the_top_logprobs_asked_only() -> None:
    """The engine computes the top `report_k` candidates of both distributions and a Step's
    record of each; with `loopchat: false` nothing reads past the top_logprobs asked (as
    llama-server's n_probs). With the extension on, the panel's 10 at least, as before."""
    base = SamplingSettings()

    def k(**body: object) -> int:
        return parse_chat({"messages": MESSAGES, **body}, base).reply.report_k

    assert k(logprobs=True, top_logprobs=5, loopchat=False) == 5
    assert k(logprobs=True, top_logprobs=0, loopchat=False) == 1
    assert k(loopchat=False) == 1
    assert k(logprobs=True, top_logprobs=20, loopchat=False) == 20
    assert k(logprobs=True, top_logprobs=5) == MIN_REPORT
    assert k(logprobs=True, top_logprobs=5, loopchat={"prompt": True}) == MIN_REPORT
    assert k(logprobs=True, top_logprobs=15) == 15


def _libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.model
@pytest.mark.server
def test_the_server_runs_on_httptools_and_uvloop_and_draws_the_same_without_the_extension(
    queue_one_server: Serve,
) -> None:
    """The server process has httptools' parser and uvloop's loop loaded (serve/http_stack.py),
    and a stream without the extension (the engine asked for the top 5 only) gives the very
    tokens and logprobs of one with it (the top 10), the same seed and settings."""
    maps = _libraries(queue_one_server.proc.pid)
    assert "/httptools/" in maps and "/uvloop/" in maps
    body = {
        "messages": MESSAGES,
        "stream": True,
        "max_tokens": 12,
        "seed": 5,
        "temperature": 0.9,
        "logprobs": True,
        "top_logprobs": 5,
        "cache_prompt": False,
    }

    def entries(extra: dict) -> tuple[list[dict], list[dict]]:
        out, chunks = [], []
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as client:
            with client.stream("POST", queue_one_server.url + "/v1/chat/completions", json={**body, **extra}) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        chunk = httpx.Response(200, content=line[6:]).json()
                        chunks.append(chunk)
                        if chunk["choices"] and chunk["choices"][0]["logprobs"]:
                            out.extend(chunk["choices"][0]["logprobs"]["content"])
        return out, chunks

    without, plain = entries({"loopchat": False})
    with_it, extended = entries({})
    assert len(without) >= 2 and without == with_it
    assert not any("loopchat" in c for c in plain)
    steps = [e for c in extended for e in extension_events(c) if isinstance(e, Step)]
    assert steps and all(len(s.raw_top) == 10 for s in steps)
