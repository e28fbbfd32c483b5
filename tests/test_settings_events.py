"""Settings validation, and events surviving the trace format unchanged."""

from __future__ import annotations

import threading

import pytest

from loopchat.events import Candidate, Finish, FinishReason, Message, Prefill, Start, Step, event_from_json_dict, to_json_dict
from loopchat.settings import LiveSettings, SamplingSettings, SettingsError
from loopchat.trace import TraceError, TraceWriter, read_trace


@pytest.mark.parametrize(
    "changes",
    [
        {"temperature": -0.1},
        {"temperature": 6},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"min_p": -1},
        {"top_k": 2.5},
        {"top_k": -1},
        {"seed": -1},
        {"max_tokens": 0},
        {"temperature": "hot"},
        {"temperature": True},
        {"warmth": 1},
    ],
)
def test_out_of_range_settings_are_rejected(changes) -> None:
    with pytest.raises(SettingsError) as err:
        SamplingSettings().replace(**changes)
    assert "\n" not in str(err.value)


def test_settings_are_immutable_and_diffable() -> None:
    a = SamplingSettings()
    with pytest.raises(Exception):
        a.temperature = 1.0  # type: ignore[misc]
    b = a.replace(temperature=1.0, top_k=5)
    assert b.diff(a) == ("temperature", "top_k")
    assert isinstance(b.top_k, int) and isinstance(b.temperature, float)
    assert SamplingSettings.from_dict(b.to_dict()) == b


def test_live_settings_swap_whole_objects() -> None:
    live = LiveSettings()
    first = live.get()
    seen = []
    live.subscribe(seen.append)
    threads = [threading.Thread(target=live.update, kwargs={"temperature": t / 10}) for t in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert live.get() is seen[-1] and first.temperature == 0.7
    assert len(seen) == 10
    with pytest.raises(SettingsError):
        live.update(top_p=0)
    assert live.get() is seen[-1]  # a rejected change leaves the current object in force


def sample_events():
    s = SamplingSettings(seed=4)
    c = (Candidate(1, "a", 0.5), Candidate(2, "ü", 0.25))
    return [
        Start("m", "/m.gguf", 10, 2048, 49152, 2, (Message("user", "hi"),), "<p>", (1, 2, 3), s, 10),
        Prefill(3, 0, 3, 1, 12.5),
        Step(0, 1, "a", "a", False, c, c, 0.5, 1, 0.5, 1, 1.5, 1.0, 2, 12.5, 3, 0.1, s, (), 4),
        Finish(FinishReason.LENGTH, 3, 1, 1, 12.5, 13.0, 0.0, 14.0, 0.0, "a", 4, 2048),
    ]


def test_events_round_trip_through_json() -> None:
    for event in sample_events():
        assert event_from_json_dict(to_json_dict(event)) == event


def test_events_round_trip_through_pickle() -> None:
    import pickle

    for event in sample_events():
        for protocol in (2, pickle.HIGHEST_PROTOCOL):  # across the engine process's pipe
            back = pickle.loads(pickle.dumps(event, protocol=protocol))
            assert back == event and type(back) is type(event) and back.kind == event.kind


def test_trace_file_round_trip(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter(path) as tw:
        for e in sample_events():
            tw.write(e)
    header, events = read_trace(path)
    assert header["schema_version"] == 1
    assert [te.event for te in events] == sample_events()


@pytest.mark.parametrize(
    "content,needle",
    [("", "empty"), ("not json\n", "not JSON"), ('{"kind": "step"}\n', "no header"), ('{"kind": "header", "schema_version": 99}\n', "99")],
)
def test_bad_traces_are_one_line_errors(tmp_path, content, needle) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert needle in str(err.value) and "\n" not in str(err.value)
