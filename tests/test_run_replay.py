"""The reply run's phases without a model (engine/run.py over tests/replay_host.py): on the
logits rows the real default model gave in the step-mode scenario (tests/run_scenarios.py:
a reshape, a hand pick, two granted draws, a resume), the run gives every event the engine
gave (tests/data/run_trace.jsonl, recorded on the engine before the run became an object),
but for the clocks and the model file's place."""

from __future__ import annotations

import json

from replay_host import ReplayHost
from run_scenarios import REPLAYED, SCENARIOS, comparable, differences, play, recorded

from loopchat.engine.run import ReplyRun
from loopchat.event_json import event_from_json_dict, to_json_dict
from loopchat.events import Start, Step

SCENARIO = next(s for s in SCENARIOS if s.name == REPLAYED)


def test_the_run_on_recorded_logits_gives_the_events_the_engine_gave() -> None:
    want = recorded(REPLAYED)
    start = event_from_json_dict(want[0])
    assert isinstance(start, Start)
    host = ReplayHost.recorded(start)
    events = play(lambda r, live, control: ReplyRun(host, r, live, control).events(), SCENARIO)
    got = [comparable(json.loads(json.dumps(to_json_dict(e)))) for e in events]
    for g in got:  # each step's sampler stages came after the recording: there, then left out
        if g["kind"] in ("step", "pending"):
            assert [r[0] for r in g.pop("stages")][:2] == ["repeat_penalty", "dry"]
    assert [e["kind"] for e in got] == [e["kind"] for e in want]
    for g, w in zip(got, (comparable(w) for w in want)):
        assert not differences(g, w), differences(g, w)
    # each token drawn went back through the "model", but the last (the reply ended with it)
    steps = [e for e in events if isinstance(e, Step)]
    assert host.forwarded == [s.token_id for s in steps[:-1]]
    assert {s.chosen_by for s in steps} == {"hand", "step", "sampled"}
