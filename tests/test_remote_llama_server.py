"""The remote backend against llama.cpp's own server (`llama-server`, built from the
llama.cpp source of the pinned llama-cpp-python by benchmarks/build_llama_bench.sh; a
few minutes the first time on a machine, then cached): its rows carry token ids and its
last chunk the prefill's time, which the panel then shows; the rest is not given."""

from __future__ import annotations

import queue
import re

import pytest
from remote_servers import reply_and_replay, start_llama_server
from tui_fixtures import panel_text, wait_for, wait_run

from loopchat.backends.remote import RemoteBackend
from loopchat.chat.plots import fmt_ms
from loopchat.chat.prefs import Prefs
from loopchat.events import Finish, Message, ModelReady, RunDone, Step, WorkerError
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings
from loopchat.tui.launch import create_app

pytestmark = [pytest.mark.model, pytest.mark.server]

SETTINGS = SamplingSettings(temperature=0.7, seed=4, max_tokens=8)


@pytest.fixture(scope="module")
def llama_server(model_path):
    server = start_llama_server(model_path, 2048)
    yield server
    server.stop()


def test_token_ids_and_the_servers_prefill_time(llama_server) -> None:
    backend = RemoteBackend(llama_server.url)
    q: queue.Queue = queue.Queue()
    backend.attach(q.put)
    try:
        backend.start()
        while not isinstance(ev := q.get(timeout=30), ModelReady):
            pass
        backend.generate(ReplyRequest((Message("user", "Name three colours."),), SETTINGS))
        events = []
        while not isinstance(ev := q.get(timeout=60), RunDone):
            events.append(ev)
    finally:
        backend.close()
    steps = [e for e in events if isinstance(e, Step)]
    finish = next(e for e in events if isinstance(e, Finish))
    assert 0 < len(steps) <= SETTINGS.max_tokens and finish.text == "".join(s.text for s in steps)
    for s in steps:
        assert isinstance(s.token_id, int) and all(isinstance(c.token_id, int) for c in s.raw_top)
        assert len(s.raw_top) == 10 and s.piece_bytes is not None
        if s.raw_rank is not None:
            assert s.raw_top[s.raw_rank - 1].token_id == s.token_id
        else:
            assert s.token_id not in {c.token_id for c in s.raw_top}
        assert s.sampled_top is None and s.forward_ms is None and s.arrival_ms is not None
    # its last chunk's usage (the stop token counted, when one was drawn) and timings
    assert finish.prompt_tokens > 0 and finish.completion_tokens in (len(steps), len(steps) + 1)
    assert finish.prefill_ms is not None and finish.prefill_ms > 0


async def test_the_panel_shows_the_servers_prefill_time(llama_server, tmp_path) -> None:
    backend = RemoteBackend(llama_server.url)
    app = create_app(backend=backend, prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json", settings=SETTINGS)
    try:
        async with app.run_test(size=(120, 50)) as pilot:
            await wait_for(pilot, app.model_ready.is_set, 30, "the model list")
            await pilot.press(*"Hi!", "enter")
            await wait_run(pilot)
            text = panel_text(app)
            assert "(the server's timing)" in text and "this pass   not given" in text
            info = str(app.transcript.reply_views()[0].info_text())
            assert "(server's) · forward and sampling times not given" in info
    finally:
        backend.close()


RANDOM_SEED = SamplingSettings(temperature=1.0, max_tokens=12)  # seed None: random


async def test_context_gauge_from_its_model_list_and_ctrl_t_shows_its_prefill(llama_server, tmp_path) -> None:
    """/v1/models' meta.n_ctx (the -c 2048 it was started with) is the gauge's n_ctx; the
    context used comes with the usage at the end; Ctrl+T shows the server's prefill time."""
    backend = RemoteBackend(llama_server.url)
    app = create_app(backend=backend, prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json", settings=SETTINGS)
    try:
        async with app.run_test(size=(120, 50)) as pilot:
            await wait_for(pilot, app.model_ready.is_set, 30, "the model list")
            assert backend.ready.n_ctx == 2048 and backend.ready.n_vocab == 49152
            await pilot.press(*"Hi!", "enter")
            await wait_run(pilot)
            rec = app.conversation.replies[0]
            assert rec.start.n_ctx == 2048 and rec.start.n_vocab == 49152 and rec.start.model_size_bytes > 0
            used = rec.finish.prompt_tokens + len(rec.steps)  # the last step's: prompt + reply so far
            assert re.search(rf"context +{used:,} / 2,048 tokens \({100 * used / 2048:.0f}%\)", panel_text(app))
            await pilot.press("ctrl+t")
            await wait_for(pilot, lambda: app.document.display and app.document.head.lines, 5, "the document view")
            head = " ".join(" ".join("".join(s for s, _ in line) for line in app.document.head.lines).split())
            assert f"prefill {fmt_ms(rec.finish.prefill_ms)} (the server's timing)" in head
            assert "prefill: not recorded" not in head
    finally:
        backend.close()


def _drawn(steps: list) -> list:
    """The reply's token ids, without a last step that adds no text: llama-server sends the end
    token's chunk (its logprobs) in one reply and not in another of the same tokens (seen once in
    a clean run: [.., 25] then [.., 25, 2]), so only the tokens of the text must be reproduced."""
    ids = [s.token_id for s in steps]
    return ids[:-1] if steps and steps[-1].text == "" else ids


async def test_f9_replays_a_random_seed_reply_and_the_server_reproduces_it(llama_server, tmp_path) -> None:
    backend = RemoteBackend(llama_server.url)
    try:
        app, original, replay, compare, info = await reply_and_replay(backend, tmp_path, RANDOM_SEED, (120, 50))
    finally:
        backend.close()
    assert isinstance(original.start.settings.seed, int) and replay.start.settings.seed == original.start.settings.seed
    ids = _drawn(original.steps)
    assert len(ids) > 3 and _drawn(replay.steps) == ids
    assert "differs" not in info[1]
    assert f"B: same tokens as reply 1 ({len(ids)})" in " ".join(compare.split())


def test_a_model_id_it_does_not_list_is_answered(llama_server) -> None:
    backend = RemoteBackend(llama_server.url, model_id="gpt-4")
    q: queue.Queue = queue.Queue()
    backend.attach(q.put)
    try:
        backend.start()
        while not isinstance(ev := q.get(timeout=30), (ModelReady, WorkerError)):
            pass
        assert isinstance(ev, ModelReady) and ev.name == "gpt-4" and ev.n_ctx == 2048  # its one model's meta
        backend.generate(ReplyRequest((Message("user", "Name three colours."),), SETTINGS))
        events = []
        while not isinstance(ev := q.get(timeout=60), RunDone):
            events.append(ev)
    finally:
        backend.close()
    assert not [e for e in events if isinstance(e, WorkerError)]
    assert [e for e in events if isinstance(e, Step)] and any(isinstance(e, Finish) for e in events)
