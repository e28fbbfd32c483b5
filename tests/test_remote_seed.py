"""F9 against a server replays the reply: with the seed random, the client draws the
reply's seed, sends it and records it, and F9 sends it again. A server that honours it
(`loopchat serve` here; llama-server in test_remote_llama_server.py) gives the same
tokens; one that ignores it (the misbehaving server's `noseed` mode, as some servers do)
is said to differ: a notice, the replay's info line and Compare's "replay" row. And a
model id the server does not list is sent as it is (a server refuses it in one line)."""

from __future__ import annotations

import pytest
from remote_servers import LoopchatServer, misbehaving_server, reply_and_replay
from tui_fixtures import wait_for, wait_run

from loopchat.backends.remote import RemoteBackend
from loopchat.chat.prefs import Prefs
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings
from loopchat.tui.launch import create_app

pytestmark = [pytest.mark.model, pytest.mark.server]

RANDOM_SEED = SamplingSettings(temperature=1.0, max_tokens=12)  # seed None: random
SIZE = (120, 40)


def notices(app) -> list[str]:
    return [str(n.message) for n in app.notices]


@pytest.fixture(scope="module")
def loopchat_server():
    s = LoopchatServer()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def fake():
    with misbehaving_server() as (url, state):
        yield url, state


async def test_f9_sends_the_drawn_seed_again_and_says_whether_the_server_reproduced_it(
    loopchat_server, tmp_path
) -> None:
    backend = RemoteBackend(loopchat_server.url)
    try:
        app, original, replay, compare, info = await reply_and_replay(backend, tmp_path, RANDOM_SEED, SIZE)
    finally:
        backend.close()
    seed = original.start.settings.seed
    assert isinstance(seed, int)  # drawn by the client, sent, recorded (was None: the server's own)
    assert replay.start.settings.seed == seed and replay.replay_of == original.number
    assert any("may not reproduce it" in n and str(seed) in n for n in notices(app))
    # what is said is what the tokens are (loopchat serve's first reply may differ from a
    # replay that reuses its KV cache: see test_remote_llama_server.py for a server that reproduces)
    if [s.token_id for s in replay.steps] == [s.token_id for s in original.steps]:
        assert "B: same tokens as reply 1" in compare and "differs" not in info[1]
        assert not any("differs" in n for n in notices(app))
    else:
        assert "B: differs from reply 1" in compare and "differs from reply 1" in info[1]
        assert any("differs from reply 1" in n for n in notices(app))


async def test_a_server_that_ignores_the_seed_is_marked_differs(fake, tmp_path) -> None:
    url, state = fake
    backend = RemoteBackend(url + "/noseed")
    try:
        app, original, replay, compare, info = await reply_and_replay(backend, tmp_path, RANDOM_SEED, SIZE)
    finally:
        backend.close()
    first, second = state["requests"][-2:]
    assert isinstance(first["seed"], int) and second["seed"] == first["seed"]  # the same drawn seed, sent twice
    assert original.start.settings.seed == first["seed"]
    said = "differs from reply 1 from token 1: this server did not reproduce the seed"
    assert any(said in n for n in notices(app))
    assert said in info[1] and "differs" not in info[0]
    assert f"B: {said}" in " ".join(compare.split())


def test_a_model_id_the_server_does_not_list_is_sent_and_its_refusal_is_one_line(fake) -> None:
    """(llama-server, which answers any id, replies to it: test_remote_llama_server.py)"""
    import queue

    from loopchat.events import Message, ModelReady, RunDone, WorkerError

    url, state = fake
    backend = RemoteBackend(url + "/ok", model_id="gpt-4")
    q: queue.Queue = queue.Queue()
    backend.attach(q.put)
    try:
        backend.start()
        while not isinstance(ready := q.get(timeout=30), (ModelReady, WorkerError)):
            pass
        assert isinstance(ready, ModelReady) and ready.name == "gpt-4"  # not refused by the client
        backend.generate(ReplyRequest((Message("user", "Hi"),), SamplingSettings(max_tokens=4, seed=1)))
        events = []
        while not isinstance(ev := q.get(timeout=60), RunDone):
            events.append(ev)
    finally:
        backend.close()
    (error,) = [e for e in events if isinstance(e, WorkerError)]  # this strict server's answer, in one line
    assert "answered 404 Not Found (The model `gpt-4` does not exist)" in error.message and "\n" not in error.message
    assert state["requests"][-1]["model"] == "gpt-4"


async def test_the_context_gauge_of_a_server_that_gives_n_ctx(fake, tmp_path) -> None:
    """GET /models' meta.n_ctx (llama-server's) is the gauge's n_ctx: "? / n_ctx" while
    the prompt's size is not known, prompt_tokens + index + 1 once the usage came."""
    import re

    from tui_fixtures import panel_text

    url, state = fake
    state["meta"] = {"n_ctx": 4096, "n_vocab": 49152, "size": 1000}
    state["mode"] = "stall"
    backend = RemoteBackend(url + "/switch")
    app = create_app(
        backend=backend,
        prefs=Prefs(markdown=False),
        prefs_path=tmp_path / "p.json",
        settings=RANDOM_SEED,
        history=False,
    )
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, app.model_ready.is_set, 30, "the model list")
            assert backend.ready.n_ctx == 4096 and backend.ready.n_vocab == 49152
            await pilot.press(*"Hi", "enter")  # one token, then nothing: no usage yet
            await wait_for(pilot, lambda: app.conversation.replies and app.conversation.replies[0].steps, 10, "a token")
            await wait_for(pilot, lambda: "? / 4,096 tokens (known at the end)" in panel_text(app), 5, "the gauge")
            await pilot.press("escape")
            await wait_run(pilot)
            state["mode"] = "ok"
            await pilot.press(*"Hi", "enter")
            await wait_run(pilot)
            rec = app.conversation.replies[-1]
            assert rec.start.n_ctx == 4096 and rec.finish.prompt_tokens == 11 and len(rec.steps) == 4
            assert re.search(r"context +15 / 4,096 tokens \(0%\)", panel_text(app))  # 11 + 3 + 1
    finally:
        backend.close()
        state.pop("meta")
