"""Issue 24, item 3 on the wire: `loopchat serve` takes OpenAI's response_format (json_object,
json_schema: the SDK's `parse()`) and llama.cpp's `grammar`, and sends each pass's constraint
figures in its `loopchat` extension; `loopchat run --url` sends the constraint to a server,
and `loopchat run` says when a reply was cut before its structure closed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from openai import OpenAI
from pydantic import BaseModel
from serve_process import KEY, Serve

from loopchat.constraint import ConstraintReport
from loopchat.events import Finish, Step
from loopchat.trace import read_trace
from loopchat.wire import extension_events

pytestmark = [pytest.mark.model, pytest.mark.server]

PY = sys.executable
MESSAGES = [{"role": "user", "content": "Describe the weather in Paris as JSON."}]


class Weather(BaseModel):
    city: str
    sunny: bool


@pytest.fixture(scope="module")
def server(queue_one_server: Serve) -> Serve:
    return queue_one_server  # the session's (conftest.py)


@pytest.fixture(scope="module")
def client(server: Serve) -> OpenAI:
    return server.client(KEY)


def test_the_sdk_parse_returns_the_object(client: OpenAI) -> None:
    reply = client.chat.completions.parse(
        model="any", messages=MESSAGES, response_format=Weather, max_tokens=60, seed=3, temperature=0.7
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Weather)
    assert Weather.model_validate_json(choice.message.content or "") == choice.message.parsed


def test_json_object_mode_parses_and_sends_the_figures(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model="any", messages=MESSAGES, response_format={"type": "json_object"}, max_tokens=60, seed=2
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)
    events = extension_events(reply.to_dict())
    steps = [e for e in events if isinstance(e, Step)]
    assert steps and all(isinstance(s.constraint, ConstraintReport) for s in steps)
    first = steps[0].constraint
    assert first.allowed < 49152 and 0.0 <= first.forbidden_mass <= 1.0 and first.top_forbidden_id >= 0
    finish = next(e for e in events if isinstance(e, Finish))
    assert finish.constraint_closed is True and finish.text == reply.choices[0].message.content


def test_llama_cpp_grammar_field_constrains_the_reply(client: OpenAI) -> None:
    grammar = 'root ::= "The answer is " ("yes" | "no") "."'
    reply = client.chat.completions.create(
        model="any", messages=MESSAGES, extra_body={"grammar": grammar}, max_tokens=20, seed=2
    )
    assert reply.choices[0].message.content in ("The answer is yes.", "The answer is no.")
    assert reply.choices[0].finish_reason == "stop"
    steps = [e for e in extension_events(reply.to_dict()) if isinstance(e, Step)]
    assert any(s.constraint.forced for s in steps) and all(s.constraint.allowed >= 1 for s in steps)


def test_a_reply_cut_by_max_tokens_says_its_structure_is_open(client: OpenAI) -> None:
    schema = {"type": "object", "properties": {"words": {"type": "array", "items": {"type": "string"}}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}
    reply = client.chat.completions.create(model="any", messages=MESSAGES, response_format=fmt, max_tokens=3, seed=1)
    assert reply.choices[0].finish_reason == "length"
    finish = next(e for e in extension_events(reply.to_dict()) if isinstance(e, Finish))
    assert finish.constraint_closed is False


def test_run_url_sends_the_constraint_and_traces_its_figures(server: Serve, tmp_path) -> None:
    schema = tmp_path / "weather.json"
    schema.write_text(json.dumps(Weather.model_json_schema()))
    trace = tmp_path / "t.jsonl"
    proc = subprocess.run(
        [PY, "-m", "loopchat", "run", "--url", server.url, "--api-key", KEY, "--json-schema", str(schema)]
        + ["--seed", "5", "--max-tokens", "60", "--trace", str(trace), "Weather in Paris?"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    Weather.model_validate_json(proc.stdout)
    steps = [t.event for t in read_trace(trace)[1] if isinstance(t.event, Step)]
    forced = sum(1 for s in steps if s.constraint.forced)
    total = sum(s.constraint.forbidden_mass for s in steps)
    line = f"loopchat: constraint JSON schema weather.json: {forced} of {len(steps)} passes forced, "
    assert f"{line}forbidden mass {total:.3f} in all ({total / len(steps):.3f} a pass)" in proc.stderr
