"""One ReplyRequest, passed whole (issue 23, item 1): through the process host's pipe
unchanged, run the same by both hosts, and accepted by every Backend as it is."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import queue
from pathlib import Path

import pytest
from remote_servers import LoopchatServer

from loopchat.backends.live import LiveBackend
from loopchat.backends.remote import RemoteBackend
from loopchat.backends.replay import ReplayBackend
from loopchat.constraint import Constraint
from loopchat.engine.host_commands import Generate
from loopchat.engine.options import EngineOptions
from loopchat.engine.process_worker import ProcessEngineWorker
from loopchat.engine.worker import EngineWorker
from loopchat.events import (
    Finish,
    FinishReason,
    Message,
    ModelReady,
    Pending,
    Prefill,
    RunDone,
    Start,
    Step,
    WireReceived,
    WorkerError,
)
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings
from loopchat.step_control import HAND

DATA = Path(__file__).parent / "data"
MESSAGES = (Message("system", "You are a helpful assistant."), Message("user", "List five animals."))
SETTINGS = SamplingSettings(seed=5, max_tokens=6, temperature=0.9)
#: every field away from its default (the test below checks it stays so)
EVERY_FIELD = ReplyRequest(
    MESSAGES,
    SETTINGS,
    stop=("zebra", "\n\n"),
    reuse_at_most=0,
    reply_prefix=(13, 15),
    first_token=2,
    forced=(330, 411),
    report_k=5,
    ignore_eos=True,
    stream=False,
    step_paused=True,
    prompt_logprobs=2,
    score_only=True,
    prompt_ids=(504, 3575),
    lens=True,
    watch=(" Paris", "zebra"),
    constraint=Constraint("regex", "(?s:.*)", "any text"),  # (the prefix and the hand's <|im_end|> fit it)
    n=2,
    draft_plan=((2, 3),),  # (draft off in SETTINGS: no pass drafts)
    prediction="Five animals: a cat, a dog",  # (lens on: no pass drafts)
    batch_probes=False,  # (a reply alone: no pass shared with another request to probe)
    step_detail=False,
)

pytestmark = [pytest.mark.model, pytest.mark.server]  # the real model on both hosts; a loopchat serve


def until_done(q: queue.Queue, timeout: float = 120) -> list:
    out = []
    while not isinstance(event := q.get(timeout=timeout), RunDone):
        out.append(event)
    return out


def ready(q: queue.Queue) -> ModelReady:
    while not isinstance(event := q.get(timeout=120), (ModelReady, WorkerError)):
        pass
    assert isinstance(event, ModelReady), event
    return event


def test_the_request_crosses_the_process_pipe_whole() -> None:
    # every field set: a field added to ReplyRequest and left out here fails this test
    for f in dataclasses.fields(ReplyRequest):
        default = f.default if f.default is not dataclasses.MISSING else object()
        assert getattr(EVERY_FIELD, f.name) != default, f"set {f.name} in EVERY_FIELD"
    # the very command the process host sends, through a pipe of the kind it uses
    ours, theirs = multiprocessing.get_context("spawn").Pipe(duplex=False)
    try:
        command = Generate(7, EVERY_FIELD)
        theirs.send(command)
        got = ours.recv()
    finally:
        ours.close()
        theirs.close()
    assert got == command
    for f in dataclasses.fields(ReplyRequest):
        assert getattr(got.request, f.name) == getattr(EVERY_FIELD, f.name), f.name
    assert got.live is None and got.control is None


def _host_run(host: str, model_path: Path) -> tuple[Start, list, ReplyRequest]:
    """A first reply (its tokens and the end-of-turn token's id), then the request with
    every field the engine reads, on the host `host`; (the first reply's Start, the
    second's events, the second's request)."""
    q: queue.Queue = queue.Queue()
    worker = EngineWorker(q.put) if host == "thread" else ProcessEngineWorker(q.put)
    try:
        worker.load(EngineOptions(str(model_path), n_ctx=1024, threads=1), "m", model_path)
        ready(q)
        worker.generate(ReplyRequest(MESSAGES, SETTINGS))
        first = until_done(q)
        start = next(e for e in first if isinstance(e, Start))
        im_end = start.prompt_token_ids[start.prompt_token_texts.index("<|im_end|>")]
        prefix = tuple(e.token_id for e in first if isinstance(e, Step))[:2]
        # (n=1: a batch refuses the lens, test_batch_run.py; score_only off: it ends the reply after
        # its prefill, test_prompt_logprobs.py; prompt_ids (): they replace the messages,
        # test_serve_prompt_list.py; all cross the pipe whole, above)
        request = EVERY_FIELD.with_(
            reply_prefix=prefix, first_token=im_end, step_paused=False, n=1, score_only=False, prompt_ids=()
        )
        worker.generate(request)
        return start, until_done(q), request
    finally:
        worker.close()


def _what_ran(events: list) -> list:
    """The run's events without their timings."""
    out = []
    for e in events:
        if isinstance(e, Start):
            out.append((e.messages, e.settings, e.top_k_report, e.stop, e.reply_prefix, e.prompt_token_ids))
        elif isinstance(e, Prefill):
            out.append((e.prompt_tokens, e.reused_tokens, e.evaluated_tokens))
        elif isinstance(e, Step):
            out.append((e.index, e.token_id, e.chosen_by, e.is_stop, e.text, e.raw_top, e.sampled_top))
        elif isinstance(e, Finish):
            out.append((e.reason, e.text, e.steps, e.completion_tokens))
        else:
            out.append(e)
    return out


def test_both_hosts_run_every_field_of_the_request(model_path: Path) -> None:
    ran = {}
    for host in ("thread", "process"):
        first, events, request = _host_run(host, model_path)
        start = next(e for e in events if isinstance(e, Start))
        prefill = next(e for e in events if isinstance(e, Prefill))
        steps = [e for e in events if isinstance(e, Step)]
        finish = events[-1]
        assert isinstance(finish, Finish), events
        assert start.messages == request.messages and start.settings == request.settings  # (a pinned seed)
        assert start.stop == request.stop and start.top_k_report == request.report_k == len(steps[0].raw_top)
        assert start.reply_prefix == request.reply_prefix and steps[0].index == len(request.reply_prefix)
        # reuse_at_most=0: the prompt of the first reply, in the KV cache, is evaluated again
        assert prefill.reused_tokens == 0 and prefill.evaluated_tokens >= len(first.prompt_token_ids)
        # first_token: the end of turn, by hand; ignore_eos: it does not end the reply
        assert steps[0].token_id == request.first_token and steps[0].chosen_by == HAND and not steps[0].is_stop
        # watch: each step follows the texts' first tokens
        assert [t for t, _ in start.watch] == list(request.watch) and all(len(s.watched) == 2 for s in steps)
        # step_detail off: no sampled-from top list, no repeat, the stage reports without cut texts
        assert all(s.sampled_top is None and s.repeat is None for s in steps)
        assert all(r.cut_text == "" for s in steps for r in s.stages) and any(s.stages for s in steps)
        # forced: the steps after the first token's take these, by hand too
        assert [(s.token_id, s.chosen_by) for s in steps[1:3]] == [(t, HAND) for t in request.forced]
        # a forced run ends with its last given token (here before max_tokens)
        given = 1 + len(request.forced)
        assert len(request.reply_prefix) + given < SETTINGS.max_tokens
        assert finish.reason == FinishReason.LENGTH and len(steps) == given
        ran[host] = _what_ran(events)
    assert ran["thread"] == ran["process"]


@pytest.fixture(scope="module")
def server():
    s = LoopchatServer()
    yield s
    s.stop()


#: what every backend that generates can honour
SHARED = ReplyRequest(MESSAGES, SETTINGS, stop=("zebra",), report_k=5)


def test_every_backend_takes_the_same_request(server, model_path: Path) -> None:
    replay = ReplayBackend(DATA / "reply.jsonl", speed=0)
    try:
        with pytest.raises(RuntimeError, match="a replay cannot generate"):
            replay.generate(SHARED)  # it takes the request, and says it cannot run it
    finally:
        replay.close()
    for backend in (LiveBackend(None, None, threads=1, host="thread"), RemoteBackend(server.url)):
        q: queue.Queue = queue.Queue()
        backend.attach(q.put)
        try:
            backend.start()
            ready(q)
            backend.generate(SHARED)
            events = until_done(q)
        finally:
            backend.close()
        start = next(e for e in events if isinstance(e, Start))
        steps = [e for e in events if isinstance(e, Step)]
        assert isinstance(events[-1], Finish) and events[-1].reason in (FinishReason.LENGTH, FinishReason.STOP)
        assert start.messages == MESSAGES and start.settings == SETTINGS and start.stop == SHARED.stop
        assert 0 < len(steps) <= SETTINGS.max_tokens
        if isinstance(backend, RemoteBackend):  # the server was asked for the request's report size
            wire = [e.text for e in events if isinstance(e, WireReceived) and e.text.startswith("data: {")]
            chunks = [json.loads(text.removeprefix("data: ")) for text in wire]
            tops = [
                len(t["top_logprobs"])
                for c in chunks
                if c.get("choices") and c["choices"][0].get("logprobs")
                for t in c["choices"][0]["logprobs"]["content"]
            ]
            assert len(tops) == len(steps) and set(tops) == {SHARED.report_k}
            url, body, k = backend.request(SHARED)
            assert url.endswith("/chat/completions") and k == body["top_logprobs"] == SHARED.report_k
            assert body["stop"] == ["zebra"] and body["stream"] is True and body["seed"] == SETTINGS.seed
        else:
            assert len(steps[0].raw_top) == SHARED.report_k


def test_a_local_reply_asked_to_start_stopped_waits_before_its_first_draw() -> None:
    backend = LiveBackend(None, None, threads=1, host="thread")
    q: queue.Queue = queue.Queue()
    backend.attach(q.put)
    try:
        backend.start()
        ready(q)
        backend.generate(SHARED.with_(step_paused=True))
        assert backend.control is not None and backend.control.paused
        while not isinstance(event := q.get(timeout=120), (Pending, Step)):
            pass
        assert isinstance(event, Pending) and event.index == 0  # stopped before the first draw
        backend.control.resume()
        events = until_done(q)
        assert isinstance(events[-1], Finish) and events[-1].reason != FinishReason.CANCELLED
        backend.generate(SHARED)  # not asked: it runs freely
        assert not backend.control.paused
        assert not any(isinstance(e, Pending) for e in until_done(q))
    finally:
        backend.close()
