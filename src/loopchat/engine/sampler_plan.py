"""What a step's settings (and constraint) decide before any logits are read: the chain of stages,
where sampler_tail's run of it starts, and the tests sampler.sample makes of the settings at each
step (whether a penalty may change logits, whether top-k's search can be shared with the raw
top's, whether top-p runs over the whole vocabulary). A reply's steps pass the same settings and
constraint objects, so the plan is made once for them (`plan_of`, which keeps the latest few: a
shared batch's pass draws for several replies) and read at each step: the settings' dozen attribute
reads and calls, each step's, right after a forward pass (the interpreter's code and data out of the
caches: docs/performance.md, "Fourteenth session (chain13)"), are made once a reply.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import cast

from loopchat.engine import dry
from loopchat.engine.sampler_math import SORT_LIMIT
from loopchat.engine.sampler_stages import Stage, chain_for, with_constraint
from loopchat.engine.sampler_tail import starts_at
from loopchat.settings import SamplingSettings

__all__ = ["Plan", "plan_of"]


class Plan:
    """A step's settings' decisions (immutable once made)."""

    __slots__ = (
        "settings",
        "constraint",
        "chain",
        "tail_at",
        "wide_k",
        "top_k",
        "top_p_open",
        "narrow_k",
        "penalize",
        "keeps_all",
    )

    def __init__(self, settings: SamplingSettings, constraint: Stage | None) -> None:
        self.settings, self.constraint = settings, constraint
        chain = chain_for(settings)
        #: the stages, the constraint's in its place (with_constraint)
        self.chain = chain if constraint is None else with_constraint(chain, cast(Hashable, constraint))
        #: where sampler_tail's stages begin in the chain (len(chain): it does not end with them)
        self.tail_at = starts_at(self.chain)
        greedy, k = settings.greedy, settings.top_k
        by_context = from_context(settings)
        #: top-k's k where it reads the model's logits unchanged and keeps at most SORT_LIMIT (sampler._wide_top
        #: may then find its k + 1 in the raw top's pass, for a report of at most k and k below the vocabulary's
        #: size); -1: never
        self.wide_k = (
            k
            if constraint is None and not greedy and k <= SORT_LIMIT and not settings.logit_bias and not by_context
            else -1
        )
        self.top_k = k
        #: top-p runs over what top-k leaves (the whole vocabulary where top-k does not narrow)
        self.top_p_open = not greedy and settings.top_p < 1.0
        #: a constraint's allowed tokens all go on to the distribution where top-k does not narrow them (no
        #: top-p, no min-p): its reported top is looked for among the raw top's (sampler_rawtop)
        self.keeps_all = constraint is not None and not greedy and settings.top_p >= 1.0 and settings.min_p <= 0.0
        #: the k of the top-k right after the constraint (Candidates.narrow_k)
        self.narrow_k = 1 if greedy else k
        #: whether a stage may change logits: 2 always (a logit bias), 1 where the context holds a token
        #: (the repeat, frequency and presence penalties, DRY: from_context), 0 never
        self.penalize = 2 if settings.logit_bias else 1 if by_context else 0


def from_context(settings: SamplingSettings) -> bool:
    """Whether a penalty may change logits by the context's tokens: the repeat penalty, the
    frequency and presence penalties (their window is repeat_last_n), DRY."""
    counted = settings.repeat_penalty != 1.0 or settings.frequency_penalty or settings.presence_penalty
    return bool(counted and settings.repeat_last_n > 0) or dry.enabled(
        settings.dry_multiplier, settings.dry_base, settings.dry_penalty_last_n
    )


#: the plans of the latest steps' settings, newest last (a pass of a shared batch draws for several
#: replies in turn, each with its own settings object): the tuple read and replaced whole, so another
#: thread's step sees the old one or the new
_RECENT = 8
_recent: list[tuple[Plan, ...]] = [()]


def plan_of(settings: SamplingSettings, constraint: Stage | None) -> Plan:
    """The plan of these settings and constraint: a recent step's where they are the very objects it
    was made for (the settings immutable, the stage the same object), else a new one."""
    recent = _recent[0]
    for plan in reversed(recent):
        if plan.settings is settings and plan.constraint is constraint:
            return plan
    plan = Plan(settings, constraint)
    _recent[0] = (*recent[1 - _RECENT :], plan) if len(recent) >= _RECENT else (*recent, plan)
    return plan
