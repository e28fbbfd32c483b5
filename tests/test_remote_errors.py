"""The remote backend against a small misbehaving server started here (Starlette on
uvicorn, tests/remote_servers.py) and an unreachable port: every failure is one line,
in the chat and from `loopchat run` (exit code 2); the conversation and the typed text
are kept; Esc cancels a stalled stream at once."""

from __future__ import annotations

import math
import queue
import time
from contextlib import asynccontextmanager

import pytest
from remote_servers import MODEL, free_port, misbehaving_server
from tui_fixtures import wait_for, wait_run

from loopchat.backends.remote import RemoteBackend
from loopchat.chat.prefs import Prefs
from loopchat.cli import main as cli
from loopchat.events import (
    Finish,
    FinishReason,
    Message,
    ModelReady,
    RunDone,
    Start,
    Step,
    WireReceived,
    WorkerError,
)
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings
from loopchat.tui.launch import create_app

pytestmark = pytest.mark.server

MESSAGES = (Message("user", "Hello?"),)
SETTINGS = SamplingSettings(temperature=0.5, seed=9, max_tokens=16)


@pytest.fixture(scope="module")
def server():
    with misbehaving_server() as (url, state):
        yield url, state


class Events:
    """A backend's events, read in order with deadlines."""

    def __init__(self, backend: RemoteBackend) -> None:
        self.backend = backend
        self.q: queue.Queue = queue.Queue()
        self.seen: list = []
        backend.attach(self.q.put)

    def next(self, timeout: float = 20.0):
        ev = self.q.get(timeout=timeout)
        self.seen.append(ev)
        return ev

    def until(self, kind: type, timeout: float = 20.0) -> list:
        out = []
        while True:
            ev = self.next(timeout)
            out.append(ev)
            if isinstance(ev, kind):
                return out


def connected(url: str, **kw) -> tuple[RemoteBackend, Events]:
    backend = RemoteBackend(url, **kw)
    events = Events(backend)
    backend.start()
    got = events.until((ModelReady, WorkerError))[-1]
    assert isinstance(got, ModelReady), got
    return backend, events


def reply(url: str, stream: bool = True, **kw) -> list:
    backend, events = connected(url, **kw)
    try:
        backend.generate(ReplyRequest(MESSAGES, SETTINGS, stream=stream))
        return events.until(RunDone)
    finally:
        backend.close()


def one_error(evs: list) -> WorkerError:
    errors = [e for e in evs if isinstance(e, WorkerError)]
    assert len(errors) == 1, evs
    assert "\n" not in errors[0].message and not errors[0].internal
    assert not any(isinstance(e, Finish) for e in evs), evs
    return errors[0]


# ---- a well-formed stream: what the wire gives, and only that --------------------------


def test_a_well_formed_stream_becomes_steps_with_only_what_the_wire_gives(server) -> None:
    url, state = server
    evs = reply(url + "/ok")
    start = next(e for e in evs if isinstance(e, Start))
    steps = [e for e in evs if isinstance(e, Step)]
    finish = next(e for e in evs if isinstance(e, Finish))
    assert start.source == url + "/ok/v1" and start.model_name == MODEL
    assert (start.n_ctx, start.prompt_token_ids, start.threads, start.model_path) == (None, None, None, None)
    # one step per logprobs entry: "Hi", then "é" split over two tokens, then " there"
    assert [s.text for s in steps] == ["Hi", "", "é", " there"]
    assert [s.piece_bytes for s in steps] == [b"Hi", b"\xc3", b"\xa9", None]
    assert "".join(s.text for s in steps) == finish.text == "Hié there"
    hi = steps[0]
    assert hi.raw_prob == pytest.approx(math.exp(-0.1)) and hi.raw_rank == 1
    assert [(c.text, c.token_id) for c in hi.raw_top] == [("Hi", None), ("zz", None)]
    assert hi.raw_top[1].prob == pytest.approx(math.exp(-1.1))
    for s in steps:  # what the server does not send is not given: None, never 0
        assert s.sampled_top is None and s.sampled_prob is None and s.raw_entropy is None
        assert s.forward_ms is None and s.sample_ms is None and s.n_past is None and s.threads is None
        assert s.token_id is None and s.candidates_kept is None
    # the arrival gaps, measured here: the two tokens of one chunk arrived together
    assert steps[0].arrival_ms == steps[0].elapsed_ms > 0
    assert steps[2].arrival_ms == 0.0 and steps[2].elapsed_ms == steps[1].elapsed_ms
    assert all(s.arrival_ms >= 0 for s in steps)
    assert finish.reason == FinishReason.STOP and finish.steps == 4
    assert (finish.prompt_tokens, finish.completion_tokens) == (11, 4)  # the server's usage
    assert finish.prefill_ms is None and finish.n_past is None and finish.n_ctx is None
    assert finish.ttft_ms == steps[0].elapsed_ms and finish.decode_ms == steps[-1].elapsed_ms - steps[0].elapsed_ms
    # every server-sent event came through as received, the comment (ping) too
    wire = [e for e in evs if isinstance(e, WireReceived)]
    assert wire[-1].text == "data: [DONE]" and ": keep-alive" in [w.text for w in wire]
    assert all(w.nbytes == len(w.text.encode()) + 2 for w in wire)
    # what was asked for
    body = state["requests"][-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["logprobs"] is True and body["top_logprobs"] == 10 and body["model"] == MODEL
    assert (body["temperature"], body["seed"], body["max_tokens"], body["top_k"]) == (0.5, 9, 16, 40)


def test_a_blocking_reply_is_one_body(server) -> None:
    url, state = server
    evs = reply(url + "/ok", stream=False)
    wire = [e for e in evs if isinstance(e, WireReceived)]
    assert len(wire) == 1 and wire[0].text.startswith('{"id"') and wire[0].nbytes == len(wire[0].text.encode())
    assert state["requests"][-1]["stream"] is False and "stream_options" not in state["requests"][-1]
    steps = [e for e in evs if isinstance(e, Step)]
    finish = next(e for e in evs if isinstance(e, Finish))
    assert "".join(s.text for s in steps) == finish.text == "Hié there"
    # the tokens all arrived with the body: its arrival is the first token's, gaps 0 after
    assert [s.arrival_ms for s in steps[1:]] == [0.0] * 3 and steps[0].arrival_ms == wire[0].t_ms
    assert finish.tokens_per_s is None and finish.ttft_ms == wire[0].t_ms


def test_extensions_false_sends_only_openais_parameters(server) -> None:
    url, state = server
    reply(url + "/ok", extensions=False)
    body = state["requests"][-1]
    assert not {
        "top_k",
        "min_p",
        "repeat_penalty",
        "repeat_last_n",
        "dry_multiplier",
        "dry_base",
        "dry_allowed_length",
        "dry_penalty_last_n",
    } & set(body)


# ---- errors: one line each -----------------------------------------------------------------


@pytest.mark.parametrize(
    "mode, needles",
    [
        ("nomodel", ["404", "does not exist", "model id"]),
        ("fail", ["500", "the server failed"]),
        ("fail_mid", ["reported an error mid-reply", "CUDA error: out of memory"]),
        ("malformed", ["not JSON", "OpenAI-compatible"]),
        ("cut", ["before data: [DONE]", "incomplete"]),
    ],
)
def test_each_failure_is_one_line(server, mode, needles) -> None:
    url, _ = server
    error = one_error(reply(f"{url}/{mode}"))
    for needle in needles:
        assert needle in error.message, error.message


def test_401_is_one_line_when_listing_models(server) -> None:
    url, _ = server
    backend = RemoteBackend(url + "/unauthorized", api_key="wrong")
    events = Events(backend)
    try:
        backend.start()
        evs = events.until(WorkerError)
        assert evs[-1].during == "load" and "401" in evs[-1].message and "--api-key" in evs[-1].message
        assert backend.ready is None and backend.loading is None
    finally:
        backend.close()


def test_an_unreachable_server_is_one_line() -> None:
    port = free_port()  # nothing listens there now
    backend = RemoteBackend(f"http://127.0.0.1:{port}")
    events = Events(backend)
    try:
        backend.start()
        err = events.until(WorkerError)[-1]
        assert "cannot connect to" in err.message and "Connection refused" in err.message
        assert "\n" not in err.message
    finally:
        backend.close()


def test_a_silent_server_times_out(server) -> None:
    url, _ = server
    t0 = time.monotonic()
    error = one_error(reply(url + "/stall", timeout=1.0))
    assert "sent nothing for 1 s mid-reply" in error.message and "--timeout" in error.message
    assert time.monotonic() - t0 < 15


def test_cancel_ends_a_stalled_stream_at_once(server) -> None:
    url, state = server
    backend, events = connected(url + "/stall")
    try:
        state["ended"].clear()
        backend.generate(ReplyRequest(MESSAGES, SETTINGS))
        events.until(Step)  # the first token arrived; the server now sends nothing
        t0 = time.perf_counter()
        backend.cancel()
        evs = events.until(RunDone, timeout=5)
        took = time.perf_counter() - t0
        finish = next(e for e in evs if isinstance(e, Finish))
        assert finish.reason == FinishReason.CANCELLED and finish.text == "Hi"
        assert took < 1.0, took  # the socket is shut: no waiting for the next chunk
        # the server saw the client go: its stream ended (the loop keeps running for nobody)
        assert state["ended"].wait(10)
    finally:
        backend.close()


@pytest.mark.parametrize(
    "mode, needles",
    [
        ("unauthorized", ["401", "--api-key"]),
        ("nomodel", ["404"]),
        ("fail_mid", ["CUDA error"]),
        ("cut", ["before data: [DONE]"]),
    ],
)
def test_loopchat_run_exits_2_with_one_line(server, capsys, mode, needles) -> None:
    url, _ = server
    code = cli.main(["run", "--url", f"{url}/{mode}", "--max-tokens", "8", "Hello?"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loopchat: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_loopchat_run_unreachable_exits_2(capsys) -> None:
    code = cli.main(["run", "--url", f"http://127.0.0.1:{free_port()}/v1", "Hello?"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cannot connect to" in err, err


def test_loopchat_run_prints_a_good_stream(server, capsys) -> None:
    url, _ = server
    assert cli.main(["run", "--url", f"{url}/ok", "Hello?"]) == 0
    out, err = capsys.readouterr()
    assert out == "Hié there\n"
    assert "prefill not given" in err and "server " + url + "/ok/v1 (TTFT and tok/s at the client)" in err
    assert "prompt 11 tok" in err and "4 tok" in err


# ---- in the chat ------------------------------------------------------------------------------


@asynccontextmanager
async def chat_on(url: str, tmp_path, size: tuple[int, int]):
    """The chat app on the misbehaving server at `url`, once its model list has come."""
    backend = RemoteBackend(url)
    app = create_app(
        backend=backend, prefs=Prefs(markdown=False), prefs_path=tmp_path / "prefs.json", settings=SETTINGS
    )
    try:
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, app.model_ready.is_set, 20, "the model list")
            yield app, pilot
    finally:
        backend.close()


async def test_chat_keeps_the_conversation_and_the_typed_text_after_errors(server, tmp_path) -> None:
    url, state = server
    state["mode"] = "ok"
    async with chat_on(url + "/switch", tmp_path, (120, 40)) as (app, pilot):
        await pilot.press(*"Hello?", "enter")
        await wait_run(pilot)
        assert app.conversation.turns[-1].content == "Hié there"
        for mode, needle in (("fail", "500"), ("fail_mid", "CUDA"), ("malformed", "not JSON"), ("cut", "[DONE]")):
            state["mode"] = mode
            await pilot.press(*"And then?", "enter")
            await wait_run(pilot)
            await wait_for(pilot, lambda: app.prompt.value == "And then?", 5, "the text back in the box")
            assert needle in app.last_error and "\n" not in app.last_error
            # the conversation is as it was: the failed turn is not part of it
            assert [m.content for m in app.conversation.turns] == ["Hello?", "Hié there"]
            app.prompt.value = ""
        state["mode"] = "ok"
        await pilot.press(*"Again", "enter")
        await wait_run(pilot)
        assert [m.content for m in app.conversation.turns][-2:] == ["Again", "Hié there"]


async def test_chat_escape_stops_a_stalled_reply(server, tmp_path) -> None:
    url, state = server
    async with chat_on(url + "/stall", tmp_path, (120, 40)) as (app, pilot):
        await pilot.press(*"Hello?", "enter")
        await wait_for(pilot, lambda: app.steps_seen >= 1, 20, "the first token")
        t0 = time.perf_counter()
        await pilot.press("escape")
        await wait_run(pilot, 5)
        assert time.perf_counter() - t0 < 2
        rec = app.conversation.replies[0]
        assert rec.finish.reason == FinishReason.CANCELLED and rec.finish.text == "Hi"


async def test_the_wire_view_shows_the_bytes_received(server, tmp_path) -> None:
    url, state = server
    state["mode"] = "ok"
    async with chat_on(url + "/switch", tmp_path, (140, 50)) as (app, pilot):
        await pilot.press(*"Hello?", "enter")
        await wait_run(pilot)
        await pilot.press("f10")
        await pilot.pause()
        rec = app.conversation.replies[0]
        received = [e.text for e, _ in rec.wire]
        assert received[0].startswith('data: {"id": "chatcmpl-x"') and received[-1] == "data: [DONE]"
        assert ": keep-alive" in received  # a comment is bytes on the wire too
        shown = app.wire.text.plain
        assert "data: [DONE]" in shown and "keep-alive" in shown and f"{url}/switch/v1" in shown


def test_loopchat_run_ctrl_c_on_a_stalled_stream(server) -> None:
    import signal
    import subprocess
    import sys

    url, state = server
    state["ended"].clear()
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopchat", "run", "--url", url + "/stall", "Hello?"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout.read(2) == b"Hi"  # the first token; the server now sends nothing
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        assert time.monotonic() - t0 < 5
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    lines = err.decode().strip().splitlines()
    assert lines[-1] == "loopchat: interrupted (Ctrl+C): the reply above is partial", err
    assert "Traceback" not in err.decode()
    assert state["ended"].wait(10)  # the server saw the client go


async def test_the_settings_dialog_says_a_change_waits_for_the_next_reply(server, tmp_path) -> None:
    from textual.widgets import Static

    from loopchat.tui.settings_dialog import SettingsDialog

    url, _ = server
    async with chat_on(url + "/stall", tmp_path, (120, 40)) as (app, pilot):
        await pilot.press(*"Hello?", "enter")
        await wait_for(pilot, lambda: app.steps_seen >= 1, 20, "the first token")
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsDialog), 5, "the dialog")
        note = str(app.screen.query_one("#settings-note", Static).render())
        assert "changes apply to the next reply" in note, note
        app.screen.dismiss(None)
        await pilot.pause()
        await pilot.press("escape")
        await wait_run(pilot, 5)


def test_a_server_without_a_model_list_needs_a_model_id(server) -> None:
    url, _ = server
    backend = RemoteBackend(url + "/nolist")
    events = Events(backend)
    try:
        backend.start()
        err = events.until(WorkerError)[-1]
        assert err.during == "load" and "/models answered 404 Not Found" in err.message and "--model-id" in err.message
    finally:
        backend.close()
    evs = reply(url + "/nolist", model_id=MODEL)  # the id given is used as it is
    assert next(e for e in evs if isinstance(e, Finish)).text == "Hié there"


def test_loopchat_run_blocking_and_sampling_flags_reach_the_server(server, capsys) -> None:
    url, state = server
    args = [
        "run",
        "--url",
        f"{url}/ok",
        "--blocking",
        "--temperature",
        "0.25",
        "--top-k",
        "7",
        "--min-p",
        "0.1",
        "--repeat-penalty",
        "1.3",
        "--top-p",
        "0.8",
        "--seed",
        "42",
        "--max-tokens",
        "33",
        "--top-report",
        "4",
        "--dry-multiplier",
        "0.8",
        "--dry-penalty-last-n",
        "1024",
        "Hello?",
    ]
    assert cli.main(args) == 0
    out, err = capsys.readouterr()
    assert out == "Hié there\n" and "tok/s not given" in err  # one body: no decode rate at the client
    body = state["requests"][-1]
    assert body["stream"] is False and body["top_logprobs"] == 4
    assert {k: body[k] for k in ("temperature", "top_k", "min_p", "repeat_penalty", "top_p", "seed", "max_tokens")} == {
        "temperature": 0.25,
        "top_k": 7,
        "min_p": 0.1,
        "repeat_penalty": 1.3,
        "top_p": 0.8,
        "seed": 42,
        "max_tokens": 33,
    }
    # DRY under llama-server's names
    assert {k: body[k] for k in ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n")} == {
        "dry_multiplier": 0.8,
        "dry_base": 1.75,
        "dry_allowed_length": 2,
        "dry_penalty_last_n": 1024,
    }
