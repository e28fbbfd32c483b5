"""sampler_plan: a step's settings decided once a reply, for the replies a shared batch's pass
draws for in turn too (each its own settings object), and what the plan decides."""

from __future__ import annotations

from loopchat.engine import sampler_plan
from loopchat.engine.sampler_stages import chain_for
from loopchat.settings import SamplingSettings


def test_a_pass_of_four_replies_keeps_each_ones_plan() -> None:
    settings = [SamplingSettings(seed=i) for i in range(4)]
    first = [sampler_plan.plan_of(s, None) for s in settings]
    for _ in range(3):  # the next passes: the same four objects, drawn in turn
        assert [sampler_plan.plan_of(s, None) for s in settings] == first
    # equal settings but another object (a change mid-reply makes a new one): a new plan
    assert sampler_plan.plan_of(SamplingSettings(seed=0), None) is not first[0]


def test_a_plan_past_the_latest_few_is_made_again() -> None:
    settings = [SamplingSettings(top_k=1 + i) for i in range(sampler_plan._RECENT + 1)]
    plans = [sampler_plan.plan_of(s, None) for s in settings]
    assert sampler_plan.plan_of(settings[-1], None) is plans[-1]
    assert sampler_plan.plan_of(settings[0], None) is not plans[0]
    assert len(sampler_plan._recent[0]) == sampler_plan._RECENT


def test_the_plan_says_what_the_settings_decide() -> None:
    s = SamplingSettings(top_k=40, top_p=0.9, repeat_penalty=1.0, dry_multiplier=0.0)
    plan = sampler_plan.plan_of(s, None)
    assert plan.chain == chain_for(s)
    assert (plan.wide_k, plan.top_k, plan.narrow_k, plan.top_p_open, plan.penalize) == (40, 40, 40, True, 0)
    greedy = sampler_plan.plan_of(SamplingSettings(temperature=0.0, repeat_penalty=1.1), None)
    assert (greedy.wide_k, greedy.narrow_k, greedy.top_p_open, greedy.penalize) == (-1, 1, False, 1)
    biased = sampler_plan.plan_of(SamplingSettings(logit_bias=((5, 1.0),)), None)
    assert biased.penalize == 2 and biased.wide_k == -1
