"""The engine's reply run gives the very events it gave before it became an object
(engine/run.py): tests/data/run_trace.jsonl was recorded on the old engine (commit e1b2a7e,
tests/data/record_run_trace.py) for each of tests/run_scenarios.py's scenarios (a free run
with a live settings change, a branch with DRY and a stop string, step mode with a reshape,
a pick, granted draws and a resume). Real default model, 1 llama thread, flash attention off
(as recorded), fixed seeds: every field of every event is equal, but for the clocks and the
model file's place. (Recorded again on that old engine when the Makefile's llama.cpp patch moved
the prefill's rounding, issue 25: e1b2a7e's src with 1c62737's recorder, over the patched wheel.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from run_scenarios import SCENARIOS, comparable, differences, play, recorded

from loopchat.engine.engine import Engine
from loopchat.event_json import to_json_dict

pytestmark = pytest.mark.model  # the engine on the default model against the recorded trace


@pytest.fixture(scope="module")
def one_thread(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    # flash attention off, pinned: the trace was recorded with it off (the engine had no other
    # setting then); with it on, the logits differ in the last digits and a draw can flip
    log = tmp_path_factory.mktemp("log") / "llama.log"
    eng = Engine(model_path, n_ctx=512, threads=1, log_path=log, flash_attn="off")
    yield eng
    eng.close()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_the_run_gives_the_events_the_old_engine_gave(one_thread: Engine, scenario) -> None:
    events = play(lambda r, live, control: one_thread.run_reply(r, live=live, control=control), scenario)
    got = [comparable(json.loads(json.dumps(to_json_dict(e)))) for e in events]
    want = [comparable(w) for w in recorded(scenario.name)]
    assert got[0].pop("flash_attn") == "off"  # as the recording's engine ran (its trace has no such field)
    assert got[0].pop("huge_pages_mb") == one_thread.huge_pages_mb  # (recorded later; the logits the same either way)
    # each step's sampler stages (the waterfall) came after the recording: there, then left out
    for g in got:
        if g["kind"] in ("step", "pending"):
            assert [r[0] for r in g.pop("stages")][:2] == ["repeat_penalty", "dry"]
    assert [e["kind"] for e in got] == [e["kind"] for e in want]
    for g, w in zip(got, want):
        assert not differences(g, w), differences(g, w)
