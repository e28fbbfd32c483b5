"""The sampler's waterfall (issue 24, items 1 and 2): every stage's report (what it removed,
the mass it held, the most likely token it removed; what a logit-changing stage changed and
the mass it moved) equals an independent numpy reference (tests/waterfall_reference.py,
docs/trace-format.md "Sampler stages") to 1e-9, the rows add up, and the Step events of a
real reply record them through the trace and the history unchanged."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sampler_paths import sampler_path  # noqa: F401 (a fixture)
from waterfall_reference import waterfall

from loopchat.engine import sampler
from loopchat.event_json import event_from_json_dict, to_json_dict
from loopchat.events import Message, Start, Step
from loopchat.history.step_codec import decode_steps, encode_steps
from loopchat.settings import SamplingSettings
from loopchat.stage_report import StageReport

FIELDS = StageReport._fields


def S(**kw: object) -> SamplingSettings:
    return SamplingSettings(**{"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0, **kw})


GRID = [
    S(),
    SamplingSettings(),
    S(top_k=40),
    S(top_p=0.9),
    S(min_p=0.05),
    S(top_p=0.5, min_p=0.05, repeat_penalty=1.3),
    S(top_k=3000, top_p=0.99),
    S(top_k=3000, min_p=0.02),
    S(top_p=0.999, min_p=0.001),
    S(temperature=0.0),
    S(temperature=0.0, repeat_penalty=1.5, logit_bias={"5": 3}),
    S(dry_multiplier=0.8, top_p=0.9),
    S(logit_bias={"5": 5, "17": -100}, top_p=0.9, repeat_penalty=1.2),
    S(logit_bias={"5": 100}, top_k=40),
    S(logit_bias={"9": -100}, top_k=0, top_p=0.95, min_p=0.01),
    S(frequency_penalty=0.5, presence_penalty=0.6, top_p=0.9),
    S(frequency_penalty=1.5, repeat_penalty=1.2, dry_multiplier=0.8, logit_bias={"5": 2}, top_k=40),
    S(presence_penalty=-1.0, top_k=0, top_p=0.95, min_p=0.01),
]


def check(got: tuple[StageReport, ...], logits: np.ndarray, recent: list[int], s: SamplingSettings) -> None:
    want = waterfall(logits, recent, s)
    assert [r.stage for r in got] == [w[0] for w in want]
    for r, w in zip(got, want):
        for name, a, b in zip(FIELDS, r, w):
            if isinstance(b, float):
                assert abs(a - b) <= 1e-9, (r.stage, name, a, b)
            else:
                assert a == b, (r.stage, name, a, b)
    # the rows add up: each row's kept mass is 1 minus the masses removed above and by it
    held, left = 1.0, len(logits)
    for r in got:
        held, left = held - r.removed_mass, left - r.removed
        assert (r.kept, r.kept_mass) == (left, pytest.approx(held, abs=1e-12)), r
        assert (r.cut_id >= 0) == (r.removed > 0)


@pytest.mark.parametrize("n", [4000, 262_144])
def test_the_waterfall_equals_the_reference_on_both_paths(n: int, sampler_path: str) -> None:  # noqa: F811
    rng = np.random.default_rng(n)
    logits = (rng.standard_normal(n) * 2.5).astype(np.float32)
    logits[rng.choice(n, 30, replace=False)] += 6.0
    head = [int(i) for i in np.argsort(-logits)[:8]]
    recent = head + [3, 3, 7] + head[:3]
    for s in GRID:
        res = sampler.sample(logits, recent, s, sampler.make_rng(0))
        check(res.stages, logits, recent, s)


def test_the_logit_bias_stage_says_what_it_did() -> None:
    logits = np.random.default_rng(1).standard_normal(5000).astype(np.float32)
    top = int(np.argmax(logits))
    res = sampler.sample(logits, [], S(logit_bias={str(top): -100, "3": 0}, top_k=1), sampler.make_rng(0))
    bias = next(r for r in res.stages if r.stage == "logit_bias")
    assert (bias.removed, bias.changed) == (0, 1)  # a bias of 0 changes nothing
    p = np.exp(logits.astype(np.float64) - logits.max())
    p /= p.sum()
    assert bias.moved_mass == pytest.approx(p[top], rel=1e-6)  # the banned token's mass went to the others
    assert res.token_id != top and res.stages[-1].cut_id != top  # banned: top-k never sees it first
    assert [r.stage for r in res.stages][:3] == ["repeat_penalty", "dry", "logit_bias"]
    # no bias: no stage (the chain of every other setting is as it was)
    assert "logit_bias" not in [r.stage for r in sampler.sample(logits, [], S(), sampler.make_rng(0)).stages]


PROMPT = [Message("user", "Name three cities in France.")]
REPLY_SETTINGS = [
    SamplingSettings(seed=3, max_tokens=10),
    SamplingSettings(seed=4, max_tokens=10, top_k=0, top_p=0.9, min_p=0.02, repeat_penalty=1.3),
    SamplingSettings(seed=5, max_tokens=10, temperature=0.0, logit_bias={"28": -100, "2": 4}),
    SamplingSettings(seed=6, max_tokens=10, frequency_penalty=0.8, presence_penalty=0.6, repeat_last_n=64),
]


@pytest.mark.model
def test_the_steps_of_a_real_reply_record_the_reference_waterfall(engine) -> None:
    for settings in REPLY_SETTINGS:
        events = list(engine.generate(PROMPT, settings))
        start = next(e for e in events if isinstance(e, Start))
        steps = [e for e in events if isinstance(e, Step)]
        assert steps and all(s.stages for s in steps)
        # the same logits again, pass by pass, as the loop had them
        history = list(start.prompt_token_ids or ())
        engine.reset()
        engine._eval(history)
        for step in steps:
            logits = engine._logits().copy()
            check(step.stages, logits, history, settings)
            assert step.token_id is not None
            history.append(step.token_id)
            engine._decode_one(step.token_id)
            engine._sync()
        engine.reset()
        # a past pass shows its waterfall exactly: the trace's JSON and the history's blob keep it
        for step in steps:
            again = event_from_json_dict(json.loads(json.dumps(to_json_dict(step))))
            assert again.stages == step.stages and isinstance(again.stages[0], StageReport)
        assert [s.stages for s in decode_steps(encode_steps(steps))] == [s.stages for s in steps]
