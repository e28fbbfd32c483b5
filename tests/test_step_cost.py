"""A token's Step on the engine thread (engine/run.py's `record`): its Python calls, and
candidates that say what they said before (the real default model)."""

from __future__ import annotations

import dataclasses

import pytest
from call_count import python_calls

from loopchat.engine import run as run_module
from loopchat.events import Message, Step
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings
from loopchat.token_faces import partial_bytes

pytestmark = pytest.mark.model

#: Python calls a token's Step may take on the engine thread. It took ~171 when each of the
#: 20 candidates asked the engine for its text and its bytes and checked them again (three
#: calls each, every step); ~106 now that a reply keeps each token's face once it has been seen.
CALLS_PER_STEP = 130


def test_a_step_takes_few_python_calls_and_its_candidates_are_the_tokens_own(engine, monkeypatch):
    calls: list[int] = []
    record = run_module.ReplyRun.record

    def counted(self, drawn):
        with python_calls() as n:
            out = record(self, drawn)
        calls.append(n[0])
        return out

    monkeypatch.setattr(run_module.ReplyRun, "record", counted)
    settings = dataclasses.replace(SamplingSettings(), temperature=0.7, max_tokens=40, seed=7, dry_multiplier=0.0)
    request = ReplyRequest((Message("user", "Tell me about the sea."),), settings, ignore_eos=True)
    steps = [e for e in engine.run_reply(request) if isinstance(e, Step)]
    assert len(steps) == 40
    per_step = sum(calls[1:]) / len(calls[1:])  # (the first fills what the next ones reuse)
    assert per_step <= CALLS_PER_STEP, f"{per_step:.1f} Python calls per step"
    for step in steps:
        for c in (*step.raw_top, *step.sampled_top):
            assert c.token_id is not None
            assert (c.text, c.piece_bytes) == (engine.piece_text(c.token_id), partial_bytes(engine.piece(c.token_id)))
            assert type(c.token_id) is int and type(c.prob) is float
