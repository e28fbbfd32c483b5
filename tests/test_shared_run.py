"""Continuous batching in the engine (engine/shared_run.py, shared_batch.py, slot_host.py) on the
session's engine (the default model): a request alone runs as `Engine.run_reply` runs it; requests
submitted together share passes, each with its own events; a request whose client leaves ends at
the next pass with its cells freed, and one request's error fails only that one."""

from __future__ import annotations

import dataclasses
from typing import Any

import llama_cpp
import pytest

from loopchat.batch import SEQUENCES_MAX
from loopchat.engine.shared_batch import Ticket
from loopchat.engine.shared_run import SharedRun
from loopchat.events import Finish, FinishReason, Message, Prefill, RunDone, Start, Step, WorkerError
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings

pytestmark = pytest.mark.model


def _request(text: str, tokens: int = 8) -> ReplyRequest:
    settings = SamplingSettings(temperature=0.0, max_tokens=tokens)
    return ReplyRequest((Message("user", text),), settings, ignore_eos=True)


def _serve(engine: Any, requests: list[ReplyRequest], on_step: Any = None) -> list[list[Any]]:
    """Every request submitted at once to a SharedRun on `engine`: each one's events."""
    shared = SharedRun(4)
    events: list[list[Any]] = [[] for _ in requests]
    tickets: list[Ticket] = []

    def emit(i: int, event: Any) -> None:
        events[i].append(event)
        if on_step is not None and isinstance(event, Step):
            on_step(i, tickets[i], event)

    tickets.extend(Ticket(i, r, lambda e, i=i: emit(i, e)) for i, r in enumerate(requests))
    for t in tickets:
        assert shared.submit(t) is (t is tickets[0])  # (the first says: start serving)
    shared.serve(engine)
    assert all(isinstance(e[-1], RunDone) and e[-1].run_id == i for i, e in enumerate(events))
    return events


def _of(events: list[Any], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def test_a_request_alone_runs_as_run_reply_runs_it(engine: Any) -> None:
    request = _request("Name three colours.", tokens=10)
    engine.reset()
    alone = list(engine.run_reply(request))
    engine.reset()
    shared = _serve(engine, [request])[0][:-1]
    assert [type(e) for e in shared] == [type(e) for e in alone]
    keys = ("token_id", "text", "n_past", "forward_tokens", "raw_prob", "batch", "sequence")
    assert [[getattr(s, k) for k in keys] for s in _of(shared, Step)] == [
        [getattr(s, k) for k in keys] for s in _of(alone, Step)
    ]
    (p1,), (p2,) = _of(shared, Prefill), _of(alone, Prefill)
    assert (p1.prompt_tokens, p1.reused_tokens, p1.evaluated_tokens) == (
        p2.prompt_tokens,
        p2.reused_tokens,
        p2.evaluated_tokens,
    )
    (f1,), (f2,) = _of(shared, Finish), _of(alone, Finish)
    assert (f1.reason, f1.steps, f1.text, f1.n_past) == (f2.reason, f2.steps, f2.text, f2.n_past)


def test_requests_share_passes_a_cancelled_one_leaves_freed_an_error_fails_only_its_own(engine: Any) -> None:
    requests = [
        _request("What is rain?"),
        _request("Say hello to Bob.", tokens=50),  # its client leaves after its 2nd step
        _request("word " * 3000),  # too long for the context (2048)
        _request("What is 2+2?"),
    ]

    def leave(i: int, ticket: Ticket, step: Step) -> None:
        if i == 1 and step.index == 1:
            ticket.cancelled = True

    engine.reset()
    events = _serve(engine, requests, leave)
    for i in (0, 3):
        (finish,) = _of(events[i], Finish)
        assert finish.reason == FinishReason.LENGTH and finish.steps == 8
        sizes = [s.batch.size for s in _of(events[i], Step) if s.batch is not None]
        assert sizes and max(sizes) == 3  # 0, 1 and 3 in one pass
        assert [e.sequence for e in _of(events[i], Start)] == [None]  # each its own reply, not one of n
    (p1,), (p3,) = _of(events[1], Prefill), _of(events[3], Prefill)  # 1 and 3 joined 0: one joint prefill
    assert p1.ms == p3.ms and p1.evaluated_tokens >= 1 and p3.evaluated_tokens >= 1
    (finish,) = _of(events[1], Finish)
    assert finish.reason == FinishReason.CANCELLED and finish.steps == 2  # no step after the cancel
    assert [type(e) for e in events[2]] == [WorkerError, RunDone]
    assert events[2][0].context_overflow
    memory = llama_cpp.llama_get_memory(engine.llm.ctx)
    assert all(llama_cpp.llama_memory_seq_pos_max(memory, s) == -1 for s in range(1, SEQUENCES_MAX + 1))


def test_a_pass_s_events_are_flushed_together_before_the_next_decode(engine: Any) -> None:
    """The server hands a pass's events to its event loop in one go (serve/batch_loop.py): the
    shared run calls `flush` once the sequences have drawn, before the decode. Each flush
    carries at most one Step of each request, and no token waits across a forward pass (the
    engine's pass count when its Step was emitted is the count when it was flushed), and no
    Start waits for its prefill: a server sends the response's head while the prompt is read
    (held back to the first Step, the first token over HTTP came ~2 ms later: performance.md)."""
    requests = [_request("What is rain?"), _request("Name a fruit."), _request("Count to five.")]
    pending: list[tuple[int, Any, int]] = []  # (request, event, engine.passes at the emit)
    flushes: list[list[tuple[int, Any, int]]] = []

    def flush() -> None:
        if pending:
            waited = [e for _, e, passes in pending if isinstance(e, Step) and passes != engine.passes]
            assert not waited, "a token waited for a forward pass before its flush"
            flushes.append(list(pending))
            pending.clear()

    shared = SharedRun(4, flush)
    tickets = [Ticket(i, r, lambda e, i=i: pending.append((i, e, engine.passes))) for i, r in enumerate(requests)]
    engine.reset()
    for t in tickets:
        shared.submit(t)
    shared.serve(engine)
    assert not pending  # (serve's end flushed the last RunDones)
    steps = [[e for _, e, _ in f if isinstance(e, Step)] for f in flushes]
    assert sum(len(s) for s in steps) == 3 * 8
    for f in flushes:
        ids = [i for i, e, _ in f if isinstance(e, Step)]
        assert len(ids) == len(set(ids)), "two Steps of one request in one flush: it waited a pass"
    # one flush a pass once all three run: 24 Steps in about 8 + 1 flushes, not 24
    assert sum(1 for s in steps if s) <= 10
    assert max(len(s) for s in steps) == 3
    for i in range(3):
        at = {type(e): n for n, f in enumerate(flushes) for j, e, _ in f if j == i and type(e) in (Start, Prefill)}
        assert at[Start] < at[Prefill], f"request {i}'s Start waited for its prefill"


def test_requests_that_arrive_during_the_first_one_s_prefill_join_its_joint_prefill(engine: Any) -> None:
    """Requests that arrive while the first request to an idle run is prefilled alone (the
    benchmark's N clients together: their POSTs land a few ms apart) are prefilled in one joint
    decode at once, their first tokens before the first one's second; one that arrives during
    that joint prefill is prefilled next, before the pass. Before, each waited for a pass of
    the running requests and the next admission (docs/performance.md, eighth session)."""
    late = [_request("Name a fruit."), _request("Count to five."), _request("Say hi."), _request("Name a tree.")]
    order: list[tuple[int, Any]] = []
    shared = SharedRun(5)
    tickets: list[Ticket] = []

    def emit(i: int, event: Any) -> None:
        order.append((i, event))
        if i == 0 and isinstance(event, Start):  # (on the engine thread, before its prefill)
            for t in tickets[1:4]:
                assert shared.submit(t) is False  # (serving already)
        if i == 1 and isinstance(event, Prefill):  # (after the joint prefill)
            assert shared.submit(tickets[4]) is False

    tickets.extend(Ticket(i, r, lambda e, i=i: emit(i, e)) for i, r in enumerate([_request("What is rain?"), *late]))
    engine.reset()
    assert shared.submit(tickets[0])
    shared.serve(engine)
    firsts = {}
    for n, (i, e) in enumerate(order):
        if isinstance(e, Step):
            firsts.setdefault((i, e.index), n)
    assert all(firsts[(i, 0)] < firsts[(0, 1)] for i in (1, 2, 3, 4)), "a late request waited for a pass"
    prefills = [next(e for i, e in order if i == j and isinstance(e, Prefill)) for j in (1, 2, 3, 4)]
    assert len({p.ms for p in prefills[:3]}) == 1 and all(p.batches == 1 for p in prefills)  # one joint decode
    assert prefills[3].ms != prefills[0].ms  # (the fifth's: a decode of its own)
    for j in range(5):
        (finish,) = [e for i, e in order if i == j and isinstance(e, Finish)]
        assert finish.reason == FinishReason.LENGTH and finish.steps == 8


def test_a_sequence_s_draw_and_step_take_few_python_calls_and_faces_are_the_tokens_own(
    engine: Any, monkeypatch
) -> None:
    """Each pass, every sequence draws and records its Step on the engine thread while the others
    wait: the Python calls of one (`SharedBatch._draw`), counted: ~238 before the batch's
    sequences shared one table of token faces, SlotHost bound the engine's piece functions and
    the Step was built with its BatchPass (not copied by dataclasses.replace), ~213 after (the
    engine thread's CPU a draw and Step: 650-670 us before, 430-450 after, in process)."""
    from call_count import python_calls

    from loopchat.engine import shared_batch
    from loopchat.token_faces import partial_bytes

    calls: list[int] = []
    draw = shared_batch.SharedBatch._draw

    def counted(self: Any, live: Any) -> None:
        with python_calls() as n:
            draw(self, live)
        if live.run.steps > 2:  # (a request's first draws: not a pass's)
            calls.append(n[0])

    monkeypatch.setattr(shared_batch.SharedBatch, "_draw", counted)
    engine.reset()
    events = _serve(engine, [_request("Tell me about the sea.", 24), _request("Name three birds.", 24)])
    per_draw = sum(calls) / len(calls)
    assert per_draw <= 225, f"{per_draw:.1f} Python calls a sequence's draw and Step"
    for step in _of(events[1], Step):
        for c in (*step.raw_top, *step.sampled_top):
            assert (c.text, c.piece_bytes) == (engine.piece_text(c.token_id), partial_bytes(engine.piece(c.token_id)))


def test_a_sequence_of_a_batch_finds_dry_s_breakers_through_its_engine(engine: Any) -> None:
    """Each request of a shared run (and each reply of n) reaches the model through a host of
    its own (SlotHost, SequenceHost): DRY's breakers (the vocabulary's tokens holding "\\n",
    ":", '"' or "*") must be the engine's set, found once per model. Before, each new host
    scanned all 49,152 pieces on its request's first draw, on the engine thread, while the
    running requests waited: 350-740 ms a joining request at load 11 (docs/performance.md)."""
    from loopchat.engine import dry
    from loopchat.engine.batch_run import SequenceHost
    from loopchat.engine.slot_host import SlotHost

    found = dry.breaker_table(engine)
    assert engine.tokenize("\n")[-1] in found and engine.tokenize(" cat")[-1] not in found
    for host in (SlotHost(engine, 1, None, None, lambda: False), SequenceHost(engine, 2)):
        assert dry.History([1, 2], host).breakers is found


def test_a_pass_of_requests_that_show_no_batch_figures_is_not_probed(engine: Any) -> None:
    """A probe (what one sequence's pass costs beside the batch's: BatchPass.single_ms) is a decode
    of the model's weights of its own: a pass none of whose requests shows batch figures (a served
    request with the extension off, `loopchat: false`) makes none; one request that shows them is
    enough for the pass to be probed, and its figures are every request's of that pass."""
    from loopchat.serve.requests import parse_chat

    asks = [{"messages": [{"role": "user", "content": "Hi."}], **x} for x in ({"loopchat": False}, {})]
    assert [parse_chat(a, SamplingSettings()).reply.batch_probes for a in asks] == [False, True]
    quiet = [
        dataclasses.replace(_request(t, tokens=4), batch_probes=False) for t in ("What is rain?", "Name a colour.")
    ]
    engine.reset()
    for requests, probed in ((quiet, False), ([quiet[0], _request("Name a colour.", tokens=4)], True)):
        events = _serve(engine, requests)
        for each in events:
            passes = [s.batch for s in _of(each, Step) if s.batch is not None]
            assert len(passes) == 3 and all(p.size == 2 for p in passes)  # (steps 1-3: batched passes 1-3)
            assert all((p.single_ms is not None) is probed for p in passes), passes


def test_a_request_without_step_detail_gives_the_same_steps_less_the_detail(engine: Any) -> None:
    """A served request with the extension off (`loopchat: false`) asks for no step detail: its
    Steps are the full ones (same seed, alone and in a pass of two) but for the sampled-from top
    list (None: not given), the stage reports' cut texts ("") and the repeat (None), none of which
    its chunks carry; every figure the wire sends from a Step is the same."""
    from loopchat.serve.requests import parse_chat

    asks = [{"messages": [{"role": "user", "content": "Hi."}], **x} for x in ({"loopchat": False}, {})]
    assert [parse_chat(a, SamplingSettings()).reply.step_detail for a in asks] == [False, True]
    settings = SamplingSettings(temperature=0.9, top_k=40, top_p=0.9, min_p=0.05, seed=11, max_tokens=24)
    drawn = ReplyRequest((Message("user", "Sing."),), settings, ignore_eos=True, report_k=5)
    # (a reply that repeats itself, its tokens given: Step.repeat set at steps of the full one)
    repeating = dataclasses.replace(drawn, forced=(engine.tokenize(" la")[-1],) * 24)
    other = _request("What is rain?", tokens=24)
    detail = ("sampled_top", "stages", "repeat")
    full_steps: list[Step] = []
    for full in (drawn, repeating):
        lean = dataclasses.replace(full, step_detail=False)
        for group in ([full], [full, other]):
            engine.reset()
            a = _of(_serve(engine, group)[0], Step)
            engine.reset()
            b = _of(_serve(engine, [lean, *group[1:]])[0], Step)
            assert len(a) == len(b) == 24
            for x, y in zip(a, b):
                assert y.sampled_top is None and y.repeat is None
                assert y.stages == tuple(r._replace(cut_text="") for r in x.stages)
                for f in dataclasses.fields(Step):
                    if f.name not in detail and f.name not in ("sample_ms", "elapsed_ms", "forward_ms", "batch"):
                        assert getattr(x, f.name) == getattr(y, f.name), (x.index, f.name)
            full_steps += a
    assert all(s.sampled_top for s in full_steps) and any(r.cut_text for s in full_steps for r in s.stages)
    assert any(s.repeat is not None for s in full_steps)
