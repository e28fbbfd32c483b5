"""Events to and from JSON: the trace's lines (docs/trace-format.md), the history's rows and the
wire's `loopchat` extension all use `to_json_dict` / `event_from_json_dict`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from loopchat.batch import batch_pass
from loopchat.constraint import ConstraintReport
from loopchat.events import (
    Candidate,
    ContextTrimmed,
    Event,
    Finish,
    FinishReason,
    LensRow,
    Message,
    Prefill,
    Start,
    Step,
)
from loopchat.passes import RejectedDraft, pass_report
from loopchat.settings import SamplingSettings
from loopchat.stage_report import stage_reports
from loopchat.watch import WatchedToken

_KINDS: dict[str, type] = {
    "start": Start,
    "context_trimmed": ContextTrimmed,
    "prefill": Prefill,
    "step": Step,
    "finish": Finish,
}


#: values that are their own JSON form (exact types: a str enum such as FinishReason is not one)
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:  # (most values: the checks below cost a step's chunk more than its encoding)
        return value
    if kind is Candidate:  # (a step's ~20, in the tuples below: their exact types first, the same forms)
        return _candidate(value)
    if kind is tuple:
        return _items(value)
    if isinstance(value, SamplingSettings):
        return _settings_dict(value)
    if isinstance(value, Message):
        return value.to_dict()
    if isinstance(value, Candidate):
        return _candidate(value)
    if isinstance(value, FinishReason):
        return value.value
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple):  # (a NamedTuple's too)
        return _items(value)
    return value


def _candidate(c: Candidate) -> list[Any]:
    """[token id, text, probability] and, where recorded, its bytes in hex."""
    out = [c.token_id, c.text, c.prob]
    return out if c.piece_bytes is None else [*out, c.piece_bytes.hex()]


def _items(value: tuple[Any, ...]) -> list[Any]:
    return [v if type(v) in _SCALARS else _plain(v) for v in value]


#: the last settings written and their dict: a reply's steps share one SamplingSettings object
#: until a setting changes (one tuple, replaced whole: safe from any thread)
_last_settings: tuple[SamplingSettings | None, dict[str, Any]] = (None, {})


def _settings_dict(settings: SamplingSettings) -> dict[str, Any]:
    global _last_settings
    last, data = _last_settings
    if last is not settings:
        data = settings.to_dict()
        _last_settings = (settings, data)
    return dict(data)  # (a dict of its own for each event, as before)


#: each event class's fields but `kind`, in order
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls) if f.name != "kind")
    return names


def to_json_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready dict for one event (`kind` first). Candidates are [id, text, prob],
    and their bytes in hex after them when they are a piece of a character."""
    out: dict[str, Any] = {"kind": event.kind}
    for name in _field_names(type(event)):
        value = getattr(event, name)
        if (value is None and name in _LEFT_OUT_WHEN_NONE) or (name == "stages" and not value):
            continue
        out[name] = value if type(value) in _SCALARS else _plain(value)
    return out


#: fields a trace leaves out when not asked for (None; a Step's stages when none were recorded)
_LEFT_OUT_WHEN_NONE = frozenset(
    {"prompt_logprobs", "prompt_top", "lens", "lens_note", "watch", "watched", "constraint", "constraint_closed"}
    | {"flash_attn", "huge_pages_mb", "pass_report", "drafted", "rejected"}
    | {"sequence", "sequences", "batch", "refused"}
)


def event_from_json_dict(data: dict[str, Any]) -> Event:
    """Inverse of `to_json_dict` (unknown keys are ignored, for newer traces)."""
    kind = data.get("kind")
    cls = _KINDS.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name == "kind" or f.name not in data:
            continue
        value = data[f.name]
        decode = _DECODERS.get(f.name)
        if decode is not None and (value is not None or f.name == "stages"):
            value = decode(value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)


#: how a field's JSON value becomes the event's (any other list: a tuple; None stays None)
_DECODERS: dict[str, Callable[[Any], Any]] = {
    "settings": SamplingSettings.from_dict,
    "messages": lambda v: tuple(Message(**m) for m in v),
    "raw_top": lambda v: _candidates(v),
    "sampled_top": lambda v: _candidates(v),
    "prompt_top": lambda v: tuple(_candidates(c) for c in v),
    "lens": lambda v: tuple(LensRow(*r) for r in v),
    "stages": stage_reports,
    "watched": lambda v: tuple(WatchedToken(*w) for w in v),
    "watch": lambda v: tuple((str(t), int(i)) for t, i in v),
    "constraint": lambda v: ConstraintReport(*v),
    "pass_report": pass_report,
    "batch": batch_pass,
    "rejected": lambda v: RejectedDraft(int(v[0]), str(v[1]), float(v[2]), float(v[3])),
    "piece_bytes": bytes.fromhex,
    "reason": FinishReason,
}


def _candidates(value: list[list[Any]]) -> tuple[Candidate, ...]:
    return tuple(
        Candidate(
            None if c[0] is None else int(c[0]),
            str(c[1]),
            float(c[2]),
            bytes.fromhex(c[3]) if len(c) > 3 else None,
        )
        for c in value
    )
