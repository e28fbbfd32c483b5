"""A token's chunk on the event loop's thread: its Python calls, and the same bytes (a recorded
reply: tests/data/reply.jsonl)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from call_count import python_calls

from loopchat.event_json import to_json_dict
from loopchat.events import Step
from loopchat.trace import read_trace
from loopchat.wire import WireOptions, WireSerializer, sse_line

TRACE = Path(__file__).parent / "data" / "reply.jsonl"
#: Python calls a token's chunk may take (it took 121 when every field of the Step went
#: through event_json's type checks, a settings dict built per step and a JSONEncoder per chunk)
CALLS_PER_CHUNK = 80


def _steps() -> list[Step]:
    _, traced = read_trace(TRACE)
    steps = [t.event for t in traced if isinstance(t.event, Step) and not t.event.is_stop]
    shared = steps[0].settings  # a live reply's steps share one settings object until one changes
    return [replace(s, settings=shared) for s in steps]


def test_a_token_chunk_takes_few_python_calls():
    steps = _steps()
    serializer = WireSerializer("smollm2", WireOptions(logprobs=True, top_logprobs=5, prompt=False))
    serializer.lines(steps[0])
    with python_calls() as calls:
        for step in steps[1:]:
            serializer.lines(step)
    per_chunk = calls[0] / (len(steps) - 1)
    assert per_chunk <= CALLS_PER_CHUNK, f"{per_chunk:.1f} Python calls per token chunk"


def test_each_event_gets_its_own_settings_dict_and_a_change_shows():
    steps = _steps()
    a, b = steps[0].settings, replace(steps[0].settings, temperature=1.25)
    first = to_json_dict(replace(steps[0], settings=a))
    first["settings"]["temperature"] = -1.0  # a reader that changes its dict changes no other event's
    assert to_json_dict(replace(steps[1], settings=a))["settings"] == a.to_dict()
    assert to_json_dict(replace(steps[1], settings=b))["settings"] == b.to_dict()
    assert to_json_dict(replace(steps[2], settings=a))["settings"]["temperature"] == a.temperature


def test_a_chunk_is_json_dumps_compact_text():
    step = _steps()[1]
    obj = WireSerializer("smollm2", WireOptions(logprobs=True, top_logprobs=5)).feed(step)[0]
    obj["text"] = "naïve ✓ \u2028"  # not ASCII: written as it is, as json.dumps(ensure_ascii=False) does
    assert sse_line(obj) == "data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n\n"
