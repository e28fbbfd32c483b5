"""Replies with a fixed seed that exercise every path of the engine's reply run (engine/run.py):
a free run with a live settings change, a branch (reply prefix + first token) with DRY and a
stop string, and step mode (a reshape, a pick, granted draws, a resume).

`play(generate, scenario)` runs one: `generate(request, live, control)` is the engine's
`run_reply` (or the same run on a model-free host); it reacts to the events on the consuming
thread (a settings change after a given step; step-mode decisions at each Pending), so the
run is the same every time. tests/data/run_trace.jsonl holds what the engine gave for each
(recorded by tests/data/record_run_trace.py, on the engine as it was before the run object).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loopchat.events import Event, Message, Pending, Step
from loopchat.request import ReplyRequest
from loopchat.settings import LiveSettings, SamplingSettings
from loopchat.step_control import StepControl

MESSAGES = (Message("user", "Write a haiku about the sea."),)
SETTINGS = SamplingSettings(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1, seed=11)


@dataclass(frozen=True)
class Scenario:
    name: str
    request: ReplyRequest
    #: after the Step of this index, the live settings change so (None: never)
    change_after: tuple[int, dict[str, Any]] | None = None
    #: step mode: the action at each Pending, in order: ("reshape", changes), ("pick", rank
    #: in the raw top list), ("step", n), ("resume", None)
    actions: tuple[tuple[str, Any], ...] = field(default=())


SCENARIOS = (
    Scenario(
        "free",
        ReplyRequest(MESSAGES, SETTINGS.replace(max_tokens=7), reuse_at_most=0),
        change_after=(2, {"temperature": 0.5, "top_k": 0}),
    ),
    Scenario(
        "branch",
        ReplyRequest(
            MESSAGES,
            SETTINGS.replace(max_tokens=9, dry_multiplier=0.8),
            reuse_at_most=0,
            # the free run's first 3 tokens ("The lapping"), then its 2nd candidate for the 4th
            reply_prefix=(504, 303, 5082),
            first_token=17662,
            stop=(" the",),
        ),
    ),
    Scenario(
        "step",
        ReplyRequest(MESSAGES, SETTINGS.replace(max_tokens=6), reuse_at_most=0, step_paused=True),
        actions=(
            ("reshape", {"temperature": 1.5}),
            ("pick", 2),
            ("step", 2),
            ("resume", None),
        ),
    ),
)


def play(
    generate: Callable[[ReplyRequest, LiveSettings, StepControl | None], Iterator[Event]], s: Scenario
) -> list[Event]:
    """Every event of one scenario's run, reacting as the scenario says."""
    live = LiveSettings(s.request.settings)
    control = StepControl(paused=True) if s.request.step_paused else None
    actions = list(s.actions)
    out: list[Event] = []
    for event in generate(s.request, live, control):
        out.append(event)
        if isinstance(event, Step) and s.change_after is not None and event.index == s.change_after[0]:
            live.update(**s.change_after[1])
        if isinstance(event, Pending):
            assert control is not None and actions, f"{s.name}: a Pending with no action left"
            kind, arg = actions.pop(0)
            if kind == "reshape":
                live.update(**arg)
            elif kind == "pick":
                control.pick(event.raw_top[arg].token_id)
            elif kind == "step":
                control.step(arg)
            else:
                control.resume()
    return out


#: the scenario whose logits rows tests/data/run_logits.npz holds (replayed without a model)
REPLAYED = "step"

TRACE = Path(__file__).parent / "data" / "run_trace.jsonl"
#: what a clock measured, or where the model file is: not the run's to repeat
NOT_COMPARED = frozenset(
    {
        "forward_ms",
        "sample_ms",
        "elapsed_ms",
        "ms",
        "prefill_ms",
        "ttft_ms",
        "decode_ms",
        "total_ms",
        "tokens_per_s",
        "paused_ms",
        "model_path",
    }
)


def comparable(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k not in NOT_COMPARED}


def numpy_exp_is_libms() -> bool:
    """Whether numpy's float64 exp and log2 give the C library's (math's) bits here, on a sweep of
    the arguments the sampler takes them of (exp of 0 down to -800, log2 of (0, 1], special values)."""
    x = np.concatenate([-np.geomspace(1e-12, 800.0, 4001), np.linspace(-745.5, 0.0, 4001), [0.0, -0.0, -np.inf]])
    with np.errstate(all="ignore"):
        e = np.exp(x)
        if e.tobytes() != np.array([math.exp(v) for v in x.tolist()]).tobytes():
            return False
        p = e[e > 0]
        return bool(np.log2(p).tobytes() == np.array([math.log2(v) for v in p.tolist()]).tobytes())


#: how far a float of this CPU's may sit from the recording's: 0 (bit for bit) where numpy's
#: float64 exp and log2 are the C library's, as on the AVX2 machine that made the recording;
#: on an AVX-512 CPU numpy runs its own exp and log2, whose last bit can differ (seen: one
#: sampled probability 1 ulp off), so a few ulps there
ULPS = 0 if numpy_exp_is_libms() else 4


def differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Where two JSON values differ: every part equal, floats within ULPS units in the last place."""
    if isinstance(got, float) and isinstance(want, float):
        close = got == want or (math.isfinite(want) and abs(got - want) <= ULPS * math.ulp(want))
        return [] if close else [f"{where}: {got!r} != {want!r}"]
    if isinstance(got, dict) and isinstance(want, dict):
        if set(got) != set(want):
            return [f"{where}: keys {sorted(set(got) ^ set(want))}"]
        return [d for k in got for d in differences(got[k], want[k], f"{where}.{k}")]
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in differences(g, w, f"{where}[{i}]")]
    return [] if type(got) is type(want) and got == want else [f"{where}: {got!r} != {want!r}"]


def recorded(name: str) -> list[dict[str, Any]]:
    """The events tests/data/run_trace.jsonl holds for scenario `name`, as JSON dicts."""
    lines = [json.loads(line) for line in TRACE.read_text().splitlines()]
    return [{k: v for k, v in d.items() if k != "scenario"} for d in lines if d["scenario"] == name]
