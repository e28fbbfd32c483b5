"""The remote backend against `loopchat serve` (started here, on a free port): its chunks
carry the server engine's own events (the `loopchat` extension), so the chat's panel
gets the sampled-from distribution and the forward timings, as complete as local."""

from __future__ import annotations

import queue

import pytest
from remote_servers import LoopchatServer
from tui_fixtures import panel_text, wait_for, wait_run

from loopchat.backends.remote import RemoteBackend
from loopchat.chat.plots import fmt_ms
from loopchat.chat.prefs import Prefs
from loopchat.events import (
    Finish,
    FinishReason,
    Message,
    ModelReady,
    Prefill,
    RunDone,
    Start,
    Step,
    WireReceived,
)
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings
from loopchat.trace import read_trace
from loopchat.tui.launch import create_app
from loopchat.wire import extension_events

pytestmark = [pytest.mark.model, pytest.mark.server]

SETTINGS = SamplingSettings(temperature=0.8, seed=11, max_tokens=10)
MESSAGES = (Message("user", "Name three colours."),)


@pytest.fixture(scope="module")
def server():
    s = LoopchatServer()
    yield s
    s.stop()


def reply(server, stream: bool = True) -> list:
    backend = RemoteBackend(server.url)
    q: queue.Queue = queue.Queue()
    backend.attach(q.put)
    try:
        backend.start()
        while not isinstance(ev := q.get(timeout=30), ModelReady):
            pass
        backend.generate(ReplyRequest(MESSAGES, SETTINGS, stream=stream))
        out = []
        while not isinstance(ev := q.get(timeout=60), RunDone):
            out.append(ev)
        return out
    finally:
        backend.close()


@pytest.mark.parametrize("stream", [True, False])
def test_the_servers_own_events_arrive(server, stream) -> None:
    events = reply(server, stream)
    wire = [e for e in events if isinstance(e, WireReceived)]
    loop = [e for e in events if isinstance(e, (Start, Prefill, Step, Finish))]
    start, finish = loop[0], loop[-1]
    steps = [e for e in loop if isinstance(e, Step)]
    assert isinstance(start, Start) and isinstance(finish, Finish)
    assert start.source == server.url + "/v1" and start.prompt_token_ids and start.n_ctx and start.threads
    assert start.settings.seed == SETTINGS.seed and start.settings.temperature == SETTINGS.temperature
    # the very events the server's engine emitted: those its chunks (or body) carry
    sent = [
        e
        for w in wire
        if w.text.startswith(("data: {", "{"))
        for e in extension_events(__import__("json").loads(w.text.removeprefix("data: ")))
    ]
    assert [type(e) for e in sent] == [type(e) for e in loop]
    for mine, theirs in zip(loop, sent):
        if isinstance(mine, Step):
            assert mine.arrival_ms is not None and theirs.arrival_ms is None
            assert mine == type(mine)(
                **{
                    **{f: getattr(theirs, f) for f in theirs.__dataclass_fields__ if f != "kind"},
                    "arrival_ms": mine.arrival_ms,
                }
            )
        elif isinstance(mine, Start):
            assert mine.source and not theirs.source and mine.prompt_token_ids == theirs.prompt_token_ids
        else:
            assert mine == theirs
    # the panel's figures are all given: the sampled-from distribution and the timings
    for s in steps:
        assert s.sampled_top and s.sampled_prob is not None and s.raw_entropy is not None
        assert s.forward_ms > 0 and s.sample_ms is not None and s.n_past > len(start.prompt_token_ids)
        assert s.token_id is not None and all(c.token_id is not None for c in s.raw_top)
    assert finish.reason in (FinishReason.LENGTH, FinishReason.STOP) and finish.prefill_ms is not None
    assert finish.text == "".join(s.text for s in steps) and finish.prompt_tokens == len(start.prompt_token_ids)


def test_loopchat_run_url_traces_the_servers_events(server, tmp_path, capsys) -> None:
    from loopchat.cli import main as cli

    trace = tmp_path / "t.jsonl"
    assert cli.main(["run", "--url", server.url, "--seed", "2", "--max-tokens", "6", "--trace", str(trace), "Hi"]) == 0
    out, err = capsys.readouterr()
    _, events = read_trace(trace)
    start = events[0].event
    steps = [t.event for t in events if isinstance(t.event, Step)]
    finish = events[-1].event
    assert isinstance(start, Start) and start.source == server.url + "/v1" and start.prompt_token_ids
    assert all(s.sampled_top and s.forward_ms is not None and s.arrival_ms is not None for s in steps)
    assert out.strip() == finish.text.strip() and "(TTFT and tok/s at the client)" not in err
    assert f"server {server.url}/v1" in err and "prefill" in err and "not given" not in err


async def test_the_chat_panel_is_as_complete_as_local(server, tmp_path) -> None:
    backend = RemoteBackend(server.url)
    app = create_app(
        backend=backend, prefs=Prefs(markdown=False), prefs_path=tmp_path / "prefs.json", settings=SETTINGS
    )
    try:
        async with app.run_test(size=(120, 50)) as pilot:
            await wait_for(pilot, app.model_ready.is_set, 30, "the model list")
            await pilot.press(*"Name three colours.", "enter")
            await wait_run(pilot)
            rec = app.conversation.replies[0]
            step = rec.steps[-1]
            text = panel_text(app)
            assert f"server {backend.base} · full record" in text
            assert "raw softmax" in text and "after sampling" in text and "not given" not in text
            assert f"entropy {step.raw_entropy:.2f} → {step.sampled_entropy:.2f} bits" in text
            assert f"{fmt_ms(step.forward_ms)} forward + {fmt_ms(step.sample_ms)} sampling" in text
            assert f"arrival gap {fmt_ms(step.arrival_ms)} between chunks" in text
            assert f"context     {step.n_past:,} / {rec.start.n_ctx:,} tokens" in text
            assert "per pass" in text and "threads" in text
            info = str(app.transcript.reply_views()[0].info_text())
            assert f"streamed from {backend.base}" in info and "not given" not in info
    finally:
        backend.close()


def test_loopchat_run_raw_through_loopchat_serve(server, tmp_path, capsys) -> None:
    from loopchat.cli import main as cli

    trace = tmp_path / "raw.jsonl"
    assert (
        cli.main(
            [
                "run",
                "--url",
                server.url,
                "--raw",
                "--seed",
                "2",
                "--max-tokens",
                "5",
                "--trace",
                str(trace),
                "Once upon a time",
            ]
        )
        == 0
    )
    out, _ = capsys.readouterr()
    _, events = read_trace(trace)
    start = events[0].event
    assert start.messages[0].role == "document" and start.prompt_text == "Once upon a time"
    assert out.strip() == events[-1].event.text.strip()


def test_loopchat_run_url_sends_the_stop_strings(server, tmp_path, capsys) -> None:
    """`--stop` goes with the request: the server's engine ends the reply before it.
    (Not compared with a free run: the server's KV cache makes a second run's logits
    differ in their last bits, enough to flip a near tie even at temperature 0.)"""
    from loopchat.cli import main as cli

    trace = tmp_path / "stop.jsonl"
    args = ["run", "--url", server.url, "--seed", "1", "--temperature", "0", "--max-tokens", "60", "--stop", "7"]
    assert cli.main([*args, "--trace", str(trace), "Count from 1 to 20, separated by commas."]) == 0
    out = capsys.readouterr().out
    _, traced = read_trace(trace)
    start = traced[0].event
    steps = [t.event for t in traced if isinstance(t.event, Step)]
    finish = next(t.event for t in traced if isinstance(t.event, Finish))
    # the server's own records: the stop strings it was given, the token that completed one last
    assert start.stop == ("7",) and finish.reason == FinishReason.STOP and "7" in steps[-1].piece
    assert "7" not in out and out.strip() and out.rstrip("\n") == finish.text.rstrip("\n")
