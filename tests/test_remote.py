"""The remote backend against llama-cpp-python's own OpenAI-compatible server
(`python -m llama_cpp.server`, its [server] extra) on the default model, started here
on a free port: the events carry its top logprobs and the arrival gaps, everything it
does not send is None and shown as "not given"; `loopchat run --url` prints the reply;
the chat shows the panel."""

from __future__ import annotations

import math
import queue
import subprocess
import sys

import pytest
from remote_servers import LlamaCppServer
from tui_fixtures import panel_text, wait_for, wait_run

from loopchat.backends.remote import RemoteBackend
from loopchat.chat.plots import fmt_ms, fmt_prob, show_token
from loopchat.chat.prefs import Prefs
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

pytestmark = [pytest.mark.model, pytest.mark.server]

SETTINGS = SamplingSettings(temperature=0.7, seed=5, max_tokens=12)
MESSAGES = (Message("user", "Name three colours."),)


@pytest.fixture(scope="module")
def llama_server(model_path):
    server = LlamaCppServer(model_path)
    yield server
    server.stop()


def collect(backend: RemoteBackend, timeout: float = 60.0) -> list:
    q: queue.Queue = queue.Queue()
    backend.attach(q.put)
    out = []
    while True:
        ev = q.get(timeout=timeout)
        out.append(ev)
        if isinstance(ev, (RunDone, WorkerError)):
            return out


@pytest.fixture(scope="module")
def streamed(llama_server):
    backend = RemoteBackend(llama_server.url)  # no /v1: it is added
    q: queue.Queue = queue.Queue()
    backend.attach(q.put)
    backend.start()
    while not isinstance(ev := q.get(timeout=30), (ModelReady, WorkerError)):
        pass
    assert isinstance(ev, ModelReady), ev
    backend.generate(ReplyRequest(MESSAGES, SETTINGS))
    events = collect(backend)
    backend.close()
    return backend, events


def test_the_model_list_names_the_server_model(streamed, model_path) -> None:
    backend, _ = streamed
    assert backend.base.endswith("/v1") and backend.model_id == str(model_path)  # the server's first model
    assert backend.served == [str(model_path)] and backend.model_names == backend.served


def test_steps_carry_the_top_logprobs_and_the_arrival_gaps(streamed) -> None:
    _, events = streamed
    start = next(e for e in events if isinstance(e, Start))
    steps = [e for e in events if isinstance(e, Step)]
    finish = next(e for e in events if isinstance(e, Finish))
    assert start.source.endswith("/v1") and start.top_k_report == 10 and start.settings == SETTINGS
    assert len(steps) == SETTINGS.max_tokens and finish.reason == FinishReason.LENGTH
    for s in steps:
        # raw_top: its top_logprobs as probabilities, most likely first, at most 10
        assert 1 <= len(s.raw_top) <= 10
        probs = [c.prob for c in s.raw_top]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
        assert s.raw_prob is not None and 0 < s.raw_prob <= 1
        if s.raw_rank is not None:  # the drawn token is in the list: at that place
            c = s.raw_top[s.raw_rank - 1]
            assert (c.text, c.prob) == (s.piece, s.raw_prob)
        else:  # llama-cpp-python appends a drawn token outside its top 10: rank not known
            assert s.raw_prob <= s.raw_top[-1].prob
        # not given: None, never 0 and never an estimate
        assert (s.sampled_top, s.sampled_prob, s.sampled_rank, s.raw_entropy, s.sampled_entropy) == (None,) * 5
        assert (s.forward_ms, s.sample_ms, s.n_past, s.threads, s.token_id, s.candidates_kept) == (None,) * 6
    # the arrival gaps: measured here, one per chunk, the first since the request
    assert steps[0].arrival_ms == steps[0].elapsed_ms
    for a, b in zip(steps, steps[1:]):
        # (0: two chunks came in one read, on a busy machine)
        assert b.arrival_ms == pytest.approx(b.elapsed_ms - a.elapsed_ms, abs=1e-6) and b.arrival_ms >= 0
    assert finish.ttft_ms == steps[0].elapsed_ms and finish.prefill_ms is None and finish.n_ctx is None
    assert finish.tokens_per_s == pytest.approx((len(steps) - 1) / (finish.decode_ms / 1000))
    assert finish.text == "".join(s.text for s in steps) and finish.text
    # llama-cpp-python sends no usage in a stream: the reply's tokens are the entries counted
    assert finish.prompt_tokens is None and finish.completion_tokens == len(steps)


def test_what_arrived_is_handed_on_as_received(streamed) -> None:
    _, events = streamed
    wire = [e for e in events if isinstance(e, WireReceived)]
    steps = [e for e in events if isinstance(e, Step)]
    assert wire[-1].text == "data: [DONE]"
    assert len(wire) == len(steps) + 3  # the role chunk, one per token, the finish chunk, [DONE]
    assert all(w.text.startswith("data: ") for w in wire)
    assert [w.t_ms for w in wire] == sorted(w.t_ms for w in wire)
    # each token's step comes after the event that carried it, with that event's time
    assert {s.elapsed_ms for s in steps} <= {w.t_ms for w in wire}


def test_a_blocking_request_is_one_body(llama_server) -> None:
    backend = RemoteBackend(llama_server.url + "/v1/")
    try:
        backend.start()
        backend.generate(ReplyRequest(MESSAGES, SETTINGS, stream=False))
        events = collect(backend)
    finally:
        backend.close()
    wire = [e for e in events if isinstance(e, WireReceived)]
    steps = [e for e in events if isinstance(e, Step)]
    finish = next(e for e in events if isinstance(e, Finish))
    assert len(wire) == 1 and wire[0].text.startswith("{") and '"chat.completion"' in wire[0].text
    assert finish.text == "".join(s.text for s in steps) and len(steps) >= SETTINGS.max_tokens
    assert finish.prompt_tokens > 0  # a body has usage
    assert all(math.isclose(s.elapsed_ms, wire[0].t_ms) for s in steps)


def test_loopchat_run_url_prints_the_reply(llama_server) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopchat",
            "run",
            "--url",
            llama_server.url,
            "--seed",
            "3",
            "--max-tokens",
            "10",
            "Say hello.",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and "Traceback" not in proc.stderr
    summary = proc.stderr.strip().splitlines()[-1]
    assert "10 tok" in summary and "prefill not given" in summary and "finish: length" in summary
    assert f"server {llama_server.url}/v1 (TTFT and tok/s at the client)" in summary


def test_loopchat_run_show_steps_says_what_is_not_given(llama_server) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopchat",
            "run",
            "--url",
            llama_server.url,
            "--seed",
            "3",
            "--max-tokens",
            "4",
            "--show-steps",
            "Say hello.",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 5  # 4 steps and the reply
    assert all("p=not given (server logprob p 0." in line and "arrived +" in line for line in lines[:4])


async def test_the_chat_panel_says_what_is_not_given(llama_server, tmp_path) -> None:
    backend = RemoteBackend(llama_server.url)
    app = create_app(
        backend=backend, prefs=Prefs(markdown=False), prefs_path=tmp_path / "prefs.json", settings=SETTINGS
    )
    try:
        async with app.run_test(size=(120, 50)) as pilot:
            await wait_for(pilot, app.model_ready.is_set, 30, "the model list")
            await pilot.press(*"Name three colours.", "enter")
            await wait_run(pilot)
            rec = app.conversation.replies[0]
            assert rec.finish.text and len(rec.steps) == SETTINGS.max_tokens
            text = panel_text(app)
            assert f"server {backend.base}" in text
            assert "server's logprobs" in text and "after sampling" not in text.split("drew")[0]
            assert "after sampling, entropy, tokens kept: not given" in text
            for label in ("prefill", "this pass", "threads", "context"):
                line = next(x for x in text.splitlines() if x.strip().startswith(label))
                assert "not given" in line, line
            last = rec.steps[-1]
            assert f"arrival gap {fmt_ms(last.arrival_ms)} between chunks" in text
            assert "per chunk" in text and "per pass" not in text and "tok/s arriving" in text
            assert f"top {len(last.raw_top)}" in text
            for c in last.raw_top[:3]:
                assert f"{show_token(c.text)[:9]}" in text and fmt_prob(c.prob) in text
            info = str(app.transcript.reply_views()[0].info_text())
            assert f"streamed from {backend.base}" in info and "prefill, forward and sampling times not given" in info
            assert f"{len(rec.steps)} tokens" in info
            # a setting changed during a reply waits for the next one: the chat says so
            await pilot.press(*"More colours?", "enter")
            await wait_for(pilot, lambda: app.generating, 10, "the second reply")
            await pilot.press("ctrl+up")
            assert any("applies to the next reply" in str(n.message) for n in app.notices)
            assert app.session.settings.temperature == pytest.approx(0.8)
            assert app.session.run_settings.temperature == pytest.approx(0.7)
            await wait_run(pilot)
            assert {s.settings.temperature for s in app.conversation.replies[1].steps} == {0.7}
    finally:
        backend.close()


def test_loopchat_run_raw_continues_a_document_through_v1_completions(llama_server, capsys) -> None:
    from loopchat.cli import main as cli

    code = cli.main(
        [
            "run",
            "--url",
            llama_server.url,
            "--raw",
            "--seed",
            "1",
            "--max-tokens",
            "6",
            "--show-steps",
            "The capital of France is",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 7 and lines[-1].strip()  # 6 steps, then the continuation
    # the legacy endpoint gives at most 5 top log-probabilities per token
    assert all("server logprob p 0." in line for line in lines[:6])
    assert "6 tok" in err and "finish: length" in err
