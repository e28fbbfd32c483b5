"""OpenAI's Predicted Outputs on `loopchat serve` (`prediction`, the chat endpoint): the
predicted text's tokens are the reply's drafts (speculative decoding, drafts.PredictionDrafter),
so the reply is the one it would be without them, made in fewer passes; usage's
`completion_tokens_details` says how many drafted tokens the verifying passes kept and refused.
A real server, OpenAI's Python SDK."""

from __future__ import annotations

import openai
import pytest
from openai import OpenAI
from serve_process import KEY, Serve

from loopchat.engine.drafts import PredictionDrafter

pytestmark = [pytest.mark.model, pytest.mark.server]

MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
ASK = {"model": MODEL, "messages": MESSAGES, "temperature": 0, "max_tokens": 120, "seed": 1}


@pytest.fixture(scope="module")
def client(queue_one_server: Serve) -> OpenAI:
    return queue_one_server.client(KEY)


def test_a_prediction_of_the_reply_drafts_it_and_the_text_is_the_same(client: OpenAI) -> None:
    plain = client.chat.completions.create(**ASK)
    text = plain.choices[0].message.content
    assert plain.usage.completion_tokens_details is None  # no prediction: nothing said of one
    predicted = client.chat.completions.create(**ASK, prediction={"type": "content", "content": text})
    assert predicted.choices[0].message.content == text
    details = predicted.usage.completion_tokens_details
    # (how many passes draft is the pace's choice, by this machine's measured pass costs: some do;
    # the prediction is the reply itself, so every draft checked is kept)
    assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens == 0, details
    # each step says which pass gave it: passes that checked the prediction's tokens
    steps = [e for e in predicted.model_extra["loopchat"]["events"] if e["kind"] == "step"]
    reports = {s["pass_report"][0]: s["pass_report"] for s in steps if s.get("pass_report")}
    assert reports and all(r[4] == "prediction" for r in reports.values())
    assert sum(r[2] for r in reports.values()) == details.accepted_prediction_tokens
    assert len({s["pass_report"][0] if s.get("pass_report") else -s["index"] for s in steps}) < len(steps)


def test_a_prediction_that_differs_changes_only_the_passes(client: OpenAI) -> None:
    """An edited prediction (a word changed throughout, as in a rename) and a stream with
    usage: the same text as the plain reply, some drafts refused and counted."""
    text = client.chat.completions.create(**ASK).choices[0].message.content
    edited = text.replace(" the ", " a ")
    assert edited != text
    stream = client.chat.completions.create(
        **ASK,
        prediction={"type": "content", "content": [{"type": "text", "text": edited}]},
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    details = chunks[-1].usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens > 0, details


@pytest.mark.parametrize(
    "prediction, needle",
    [
        ({"type": "text", "content": "x"}, 'prediction must be {"type": "content"'),
        ({"type": "content", "content": 5}, '{"type": "text", "text": ...} parts'),
        ("just text", 'prediction must be {"type": "content"'),
    ],
)
def test_a_bad_prediction_is_a_400_naming_it(client: OpenAI, prediction: object, needle: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**ASK, prediction=prediction)  # type: ignore[arg-type]
    assert needle in info.value.message and info.value.param == "prediction"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**{**ASK, "n": 2}, prediction={"type": "content", "content": "x"})
    assert "n = 1" in info.value.message


def test_the_drafter_follows_the_prediction_and_comes_back_after_a_change() -> None:
    d = PredictionDrafter([10, 11, 12, 13, 14, 10, 11, 15, 16])
    assert d.propose([1, 2, 10], 3) == [11, 12, 13]  # the reply's first token: on from there
    assert d.propose([1, 2, 10, 11, 12, 13], 3) == [14, 10, 11]  # in step: on from the last draft
    assert d.propose([1, 2, 10, 11, 12, 13, 14, 10, 11], 3) == [15, 16]  # not back to the first "10 11"
    assert d.propose([1, 2, 10, 11, 12, 13, 14, 10, 11, 15, 16], 3) == []  # its end
    d = PredictionDrafter([10, 11, 12, 13, 14, 10, 11, 15, 16])
    assert d.propose([1, 2, 99], 3) == []  # the reply left it: nothing to draft
    assert d.propose([1, 2, 99, 13], 3) == [14, 10, 11]  # and came back
