"""Branches in the engine: a reply continued from a point of an earlier one (its tokens
up to there, maybe another candidate there) reuses the KV cache up to the branch point."""

from __future__ import annotations

import pytest

from loopchat.engine.engine import Engine
from loopchat.events import Finish, Message, Prefill, Start, Step
from loopchat.settings import SamplingSettings

pytestmark = pytest.mark.model

MESSAGES = (Message("user", "Name three animals that live in the sea."),)
SETTINGS = SamplingSettings(temperature=0.8, top_k=40, top_p=0.95, seed=99, max_tokens=24)


def run(engine: Engine, **kw) -> tuple[Start, Prefill, list[Step], Finish]:
    events = list(engine.generate(MESSAGES, SETTINGS, **kw))
    start = next(e for e in events if isinstance(e, Start))
    prefill = next(e for e in events if isinstance(e, Prefill))
    return start, prefill, [e for e in events if isinstance(e, Step)], events[-1]


def test_a_branch_at_another_candidate_evaluates_only_that_token(engine: Engine) -> None:
    start, _, steps, _ = run(engine)
    at = 5
    other = next(c for c in steps[at].sampled_top + steps[at].raw_top if c.token_id != steps[at].token_id)
    prefix = [s.token_id for s in steps[:at]] + [other.token_id]
    bstart, prefill, bsteps, finish = run(engine, reply_prefix=prefix)
    n_prompt = len(start.prompt_token_ids)
    assert bstart.reply_prefix == tuple(prefix) and bstart.prompt_token_ids == start.prompt_token_ids
    # the cache held the prompt and the reply: only the new candidate is evaluated
    assert prefill.reused_tokens == n_prompt + at and prefill.evaluated_tokens == 1
    assert prefill.prompt_tokens == n_prompt + at + 1
    assert bsteps[0].index == at + 1 and bsteps[0].n_past == n_prompt + at + 2
    assert "".join(s.text for s in bsteps) == finish.text
    assert finish.completion_tokens + len(prefix) <= SETTINGS.max_tokens
    ids = list(engine.llm.input_ids[: n_prompt + at + 1])
    assert ids[n_prompt:] == prefix


def test_regenerating_from_a_point_reuses_the_reply_up_to_it(engine: Engine) -> None:
    _, _, steps, _ = run(engine)
    at = 8
    prefix = [s.token_id for s in steps[:at]]
    _, prefill, bsteps, _ = run(engine, reply_prefix=prefix)
    # (one token is always evaluated, for fresh logits: the prefix's last)
    assert prefill.evaluated_tokens == 1 and prefill.reused_tokens == prefill.prompt_tokens - 1
    assert bsteps[0].index == at
    # the same logits at the branch point (its pass is one token, as it was the first
    # time): the same die, rolled again with the current settings
    assert bsteps[0].raw_top == steps[at].raw_top and bsteps[0].raw_prob > 0


def test_the_start_holds_the_document_the_model_reads(engine: Engine) -> None:
    start, _, _, _ = run(engine)
    ids = start.prompt_token_ids
    assert len(start.prompt_token_texts) == len(ids)
    text = "".join(start.prompt_token_texts)
    # the exact text: the rendered template (with a BOS the tokenizer adds, if any)
    assert text.endswith(start.prompt_text) and engine.tokenize(start.prompt_text) == list(ids)
    special = [start.prompt_token_texts[i] for i in start.prompt_special]
    assert special and set(special) <= {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}
    assert "<|im_start|>" in special
    assert all(
        start.prompt_token_texts[i] not in ("<|im_start|>", "<|im_end|>")
        for i in range(len(ids))
        if i not in start.prompt_special
    )


def test_a_branch_with_a_first_token_records_that_pass_with_the_token_by_hand(engine: Engine) -> None:
    # the chat's "continue from another candidate": the reply up to the branch point is
    # given, and the pass at the branch point takes the candidate instead of a draw
    start, _, steps, _ = run(engine)
    at = 4
    other = next(c for c in steps[at].raw_top if c.token_id != steps[at].token_id)
    prefix = [s.token_id for s in steps[:at]]
    _, prefill, bsteps, finish = run(engine, reply_prefix=prefix, first_token=other.token_id)
    assert prefill.evaluated_tokens == 1 and prefill.reused_tokens == len(start.prompt_token_ids) + at - 1
    first = bsteps[0]
    assert first.index == at and first.token_id == other.token_id and first.chosen_by == "hand"
    assert first.raw_top == steps[at].raw_top  # the same die, from the same logits
    assert abs(first.raw_prob - other.prob) < 1e-6
    assert all(s.chosen_by == "sampled" for s in bsteps[1:])
    # the next pass's context holds the picked token
    n_prompt = len(start.prompt_token_ids)
    assert list(engine.llm.input_ids[n_prompt : n_prompt + at + 1]) == prefix + [other.token_id]
    assert "".join(s.text for s in bsteps) == finish.text


def test_a_first_token_outside_the_vocabulary_is_refused_before_any_event(engine: Engine) -> None:
    import pytest

    from loopchat.errors import EngineError

    gen = engine.generate(MESSAGES, SETTINGS, first_token=engine.n_vocab + 5)
    with pytest.raises(EngineError):
        next(gen)
