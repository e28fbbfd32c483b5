"""Settings validation, and events surviving the trace format unchanged."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from loopchat.event_json import event_from_json_dict, to_json_dict
from loopchat.events import (
    Candidate,
    Finish,
    FinishReason,
    Message,
    Prefill,
    Start,
    Step,
)
from loopchat.settings import (
    KNOBS,
    SETTING,
    SETTINGS,
    LiveSettings,
    SamplingSettings,
    SettingsError,
    fmt_value,
)
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


def test_the_dataclass_fields_are_the_rows_of_the_table() -> None:
    fields = dataclasses.fields(SamplingSettings)
    assert [(f.name, f.default) for f in fields] == [(s.name, s.default) for s in SETTINGS]
    assert SamplingSettings.field_names() == tuple(SETTING) == tuple(f.name for f in fields)
    assert KNOBS == ("temperature", "top_p", "top_k", "min_p")  # the panel's knob, in F8's order
    assert len({s.flag for s in SETTINGS}) == len({s.short for s in SETTINGS}) == len(SETTINGS)


@pytest.mark.parametrize("spec", [s for s in SETTINGS if s.kind is None], ids=lambda s: s.name)
def test_every_setting_is_checked_against_its_row(spec) -> None:
    base = SamplingSettings()
    top = base.replace(**{spec.name: spec.hi})
    assert getattr(top, spec.name) == spec.hi and type(getattr(top, spec.name)) is spec.type
    bad = [spec.hi + 1, spec.lo - 1, "1", True] + ([spec.lo] if spec.above_lo else [])
    bad += [spec.lo + 0.5] if spec.type is int else []
    bad += [] if spec.optional else [None]
    for value in bad:
        with pytest.raises(SettingsError) as err:
            base.replace(**{spec.name: value})
        assert str(err.value).startswith(spec.name) and spec.hint in str(err.value), err.value
        assert err.value.problem in str(err.value) and spec.name not in err.value.problem
    if not spec.above_lo:
        assert getattr(base.replace(**{spec.name: spec.lo}), spec.name) == spec.lo
    if spec.optional:
        assert getattr(base.replace(**{spec.name: None}), spec.name) is None
    assert spec.range_text() in SamplingSettings.describe(spec.name)


@pytest.mark.parametrize("spec", [s for s in SETTINGS if s.type is tuple], ids=lambda s: s.name)
def test_a_setting_of_its_own_kind_is_checked_by_its_kind(spec) -> None:  # the logit bias
    base = SamplingSettings()
    top = base.replace(**{spec.name: {"7": spec.hi, "3": spec.lo}})
    assert getattr(top, spec.name) == ((3, float(spec.lo)), (7, float(spec.hi)))  # sorted by token id
    assert getattr(base.replace(**{spec.name: [[7, 1], [7, 2]]}), spec.name) == ((7, 2.0),)  # the last wins
    for value in ({"7": spec.hi + 1}, {"7": spec.lo - 1}, "1", True, {"x": 1}, {"-1": 1}, [[1, 2, 3]], {"7": "1"}):
        with pytest.raises(SettingsError) as err:
            base.replace(**{spec.name: value})
        assert str(err.value).startswith(spec.name) and spec.hint in str(err.value), err.value
        assert err.value.problem in str(err.value) and spec.name not in err.value.problem
    assert spec.parse('7=5, "x"=-1', first_token=lambda text: 42) == ((7, 5.0), (42, -1.0))
    for typed, problem in [('"x"=1', "no tokenizer"), ("7=500", "between -100 and 100"), ("7=hot", "not a number")]:
        with pytest.raises(SettingsError) as err:
            spec.parse(typed)
        assert problem in err.value.problem, err.value.problem


def test_typed_values_are_parsed_by_the_row() -> None:  # the F2 dialog's fields
    assert SETTING["seed"].parse("  ") is None  # empty seed: a random one per reply
    assert SETTING["seed"].parse("123") == 123 and SETTING["top_k"].parse("1e3") == 1000
    assert SETTING["temperature"].parse("1") == 1.0 and type(SETTING["temperature"].parse("1")) is float
    for name, text, problem in [
        ("top_k", "", "is empty"),
        ("top_k", "2.5", "must be a whole number, got 2.5"),
        ("temperature", "warm", "'warm' is not a number"),
        ("temperature", "9", "must be between 0 and 5, got 9"),
        ("top_p", "0", "must be above 0 and at most 1, got 0"),
        ("min_p", "nan", "must be between 0 and 1, got nan"),
    ]:
        with pytest.raises(SettingsError) as err:
            SETTING[name].parse(text)
        assert err.value.problem == problem


def test_the_knob_steps_and_the_panel_format_come_from_the_table() -> None:
    temperature, top_p, top_k, min_p = (SETTING[name] for name in KNOBS)
    assert temperature.nudge(0.7, 1) == 0.8 and temperature.nudge(0.0, -1) == 0.0
    assert top_p.nudge(0.1, -1) == 0.05 and top_p.nudge(0.05, -1) == 0.05  # the knob's own floor
    assert top_p.nudge(0.95, 1) == 1.0 and top_p.nudge(1.0, 1) == 1.0
    assert top_k.nudge(40, 1) == 45 and type(top_k.nudge(40, 1)) is int
    assert top_k.nudge(top_k.hi - 2, 1) == top_k.hi == 1_000_000  # reaches the settings' limit
    assert min_p.nudge(0.05, -1) == 0.04 and min_p.nudge(0.0, -1) == 0.0
    assert SETTING["repeat_penalty"].knob_step is None
    assert [
        fmt_value(n, v) for n, v in [("temperature", 0.7), ("top_k", 40), ("seed", None), ("seed", 7), ("min_p", 0.0)]
    ] == ["0.70", "40", "random", "7", "0.00"]


def test_settings_are_immutable_and_diffable() -> None:
    a = SamplingSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
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
    [
        ("", "empty"),
        ("not json\n", "not JSON"),
        ('{"kind": "step"}\n', "no header"),
        ('{"kind": "header", "schema_version": 99}\n', "99"),
    ],
)
def test_bad_traces_are_one_line_errors(tmp_path, content, needle) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert needle in str(err.value) and "\n" not in str(err.value)
