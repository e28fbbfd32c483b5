"""`loopchat serve` takes OpenAI's `logit_bias` (issue 24, item 2) through the OpenAI Python
SDK: a token biased -100 never appears, one biased +100 is drawn, each step's waterfall in
the `loopchat` extension shows the bias stage, and a bad value is a 400 in OpenAI's shape."""

from __future__ import annotations

import queue

import openai
import pytest
from serve_process import Serve
from test_serve import KEY, MESSAGES, MODEL

from loopchat.backends.remote import RemoteBackend
from loopchat.events import Message, ModelReady, RunDone, Step
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings
from loopchat.wire import extension_events

pytestmark = [pytest.mark.model, pytest.mark.server]


@pytest.fixture(scope="module")
def server(queue_one_server: Serve) -> Serve:
    return queue_one_server  # the session's (conftest.py)


def steps_of(client: openai.OpenAI, **kw: object) -> list[Step]:
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, seed=11, max_tokens=6, stream=True, logprobs=True, top_logprobs=3, **kw
        )
    )
    return [e for c in chunks for e in extension_events(c.to_dict()) if isinstance(e, Step)]


def test_logit_bias_bans_and_boosts_a_token(server: Serve) -> None:
    client = server.client(KEY)
    plain = steps_of(client)
    assert plain and all("logit_bias" not in [r.stage for r in s.stages] for s in plain)
    banned = plain[0].token_id
    steps = steps_of(client, logit_bias={str(banned): -100})
    assert banned not in [s.token_id for s in steps]
    assert all(s.settings.logit_bias == ((banned, -100.0),) for s in steps)
    row = steps[0].stages[2]
    assert (row.stage, row.changed) == ("logit_bias", 1)
    assert row.moved_mass == pytest.approx(plain[0].raw_prob, rel=1e-3)  # its raw mass went to the others
    # the raw logprobs (OpenAI's) are the model's, as before: the banned token is still there
    assert steps[0].raw_top[0].token_id == plain[0].raw_top[0].token_id
    boosted = plain[0].raw_top[4]
    steps = steps_of(client, logit_bias={str(boosted.token_id): 100})
    assert steps[0].token_id == boosted.token_id  # forced, in effect
    assert steps[0].stages[2].moved_mass == pytest.approx(1.0 - boosted.prob, abs=1e-6)  # all but its own


@pytest.mark.parametrize(
    ("bias", "says"),
    [({"5": 150}, "between -100 and 100"), ({"five": 1}, "token id"), ({"5": "a lot"}, "must be a number")],
)
def test_a_bad_logit_bias_is_a_400_in_openais_shape(server: Serve, bias: dict, says: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        server.client(KEY).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, logit_bias=bias)
    body = err.value.body
    assert isinstance(body, dict) and body.get("param") == "logit_bias" and says in body["message"], body


def test_a_loopchat_client_sends_the_bias_and_reads_the_waterfall_back(server: Serve) -> None:
    """`--url` (RemoteBackend): the settings' logit_bias goes out as OpenAI's field, and the
    steps that come back carry the server's waterfall, the bias stage in it."""
    backend = RemoteBackend(server.url, api_key=KEY)
    events: queue.Queue = queue.Queue()
    backend.attach(events.put)
    try:
        backend.start()
        while not isinstance(events.get(timeout=60), ModelReady):
            pass
        settings = SamplingSettings(seed=3, max_tokens=3, logit_bias={"504": -100})
        backend.generate(ReplyRequest((Message("user", "Name a colour."),), settings))
        got = []
        while not isinstance(ev := events.get(timeout=120), RunDone):
            got.append(ev)
    finally:
        backend.close()
    steps = [e for e in got if isinstance(e, Step)]
    assert steps and all(s.settings.logit_bias == ((504, -100.0),) for s in steps)
    assert all(s.stages[2].stage == "logit_bias" and s.stages[2].changed == 1 for s in steps)
    assert 504 not in [s.token_id for s in steps]
