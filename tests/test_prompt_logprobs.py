"""The prompt, as the model read it (issue 26, part 2): each prompt token's logprob,
computed in chunks during the prefill, on the real default model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loopchat.engine.engine import Engine
from loopchat.engine.prompt_scores import CHUNK_FLOATS
from loopchat.event_json import event_from_json_dict, to_json_dict
from loopchat.events import Message, Prefill, Start
from loopchat.request import ReplyRequest
from loopchat.settings import SamplingSettings

pytestmark = pytest.mark.model

CHAT = (
    Message("system", "You are a helpful assistant."),
    Message("user", "The capital of France is Paris. What is the capital of Germany?"),
)
ONE = SamplingSettings(seed=1, max_tokens=1)


def _start_prefill(engine: Engine, messages, **kw) -> tuple[Start, Prefill]:
    events = list(engine.generate(messages, ONE, **kw))
    start = next(e for e in events if isinstance(e, Start))
    return start, next(e for e in events if isinstance(e, Prefill))


def _fresh_logprobs(engine: Engine, tokens: tuple[int, ...], i: int) -> np.ndarray:
    """The log-softmax (float64) of a fresh evaluation of tokens[:i]: the last position's logits."""
    engine.reset()
    engine.evaluate(tokens[:i])
    engine.sync()
    logits = engine.logits().astype(np.float64)
    m = logits.max()
    return logits - (m + np.log(np.exp(logits - m).sum()))


def _fresh_logprobs_each(engine: Engine, tokens: tuple[int, ...]) -> list[np.ndarray | None]:
    """_fresh_logprobs(engine, tokens, i) for every i in 1..len-1, from one fresh evaluation fed
    one position a pass: on the default model a pass's rows do not depend on how many positions
    it holds (tests/test_batch_invariance.py), so row i is the fresh evaluation of tokens[:i]
    bit for bit (measured here: 0.0 apart), in len(tokens) positions instead of their sum."""
    engine.reset()
    engine.evaluate(tokens[:1])
    rows: list[np.ndarray | None] = [None]
    for i in range(1, len(tokens)):
        engine.sync()
        logits = engine.logits().astype(np.float64)
        m = logits.max()
        rows.append(logits - (m + np.log(np.exp(logits - m).sum())))
        if i + 1 < len(tokens):
            engine.forward(tokens[i])
    return rows


def test_surprisal_equals_a_fresh_evaluation_of_the_prefix(engine: Engine) -> None:
    engine.reset()
    start, prefill = _start_prefill(engine, CHAT, prompt_logprobs=3)
    tokens = start.prompt_token_ids
    assert prefill.prompt_logprobs is not None and prefill.prompt_top is not None
    assert len(prefill.prompt_logprobs) == len(tokens) == len(prefill.prompt_top)
    assert prefill.prompt_logprobs[0] is None and prefill.prompt_top[0] == ()
    for i in (1, 2, len(tokens) // 2, len(tokens) - 1):
        fresh = _fresh_logprobs(engine, tokens, i)
        surprisal = -prefill.prompt_logprobs[i] / math.log(2)
        assert surprisal == pytest.approx(-fresh[tokens[i]] / math.log(2), abs=1e-4)
        top = prefill.prompt_top[i]
        assert [c.token_id for c in top] == list(np.argsort(-fresh, kind="stable")[:3])
        assert [c.prob for c in top] == pytest.approx(list(np.exp(np.sort(fresh)[::-1][:3])), abs=1e-5)
        assert top[0].text == engine.piece_text(top[0].token_id)


def test_not_asked_not_computed(engine: Engine) -> None:
    engine.reset()
    _, prefill = _start_prefill(engine, CHAT)
    assert prefill.prompt_logprobs is None and prefill.prompt_top is None


def test_chunks_are_bounded_and_a_next_turn_reuses_the_scored_cache(engine: Engine) -> None:
    engine.reset()
    # 60 words: 190 tokens, two chunks (170 + 20) (120 words made 390 tokens, three chunks, and
    # 80 words 250, for the same checks: the chunks' count, the second turn's reuse and its fresh
    # row; each prompt token is evaluated twice: the first turn's prefill, the fresh row's)
    long_chat = (CHAT[0], Message("user", " ".join(f"word{i}" for i in range(60))))
    start, prefill = _start_prefill(engine, long_chat, prompt_logprobs=1)
    chunk = CHUNK_FLOATS // engine.n_vocab
    assert len(start.prompt_token_ids) > chunk  # more than one chunk
    assert prefill.batches == math.ceil(prefill.evaluated_tokens / chunk)
    first = prefill.prompt_logprobs
    # the next turn: the cache holds the prompt (and the reply's token, not scored)
    turn2 = (*long_chat, Message("assistant", "Yes."), Message("user", "Again?"))
    start2, prefill2 = _start_prefill(engine, turn2, prompt_logprobs=1)
    assert 0 < prefill2.reused_tokens < len(start.prompt_token_ids)
    common = prefill2.reused_tokens
    assert len(prefill2.prompt_logprobs) == len(start2.prompt_token_ids)
    assert prefill2.prompt_logprobs[: common + 1] == pytest.approx(first[: common + 1], abs=1e-6)
    i = len(start2.prompt_token_ids) - 2
    fresh = _fresh_logprobs(engine, start2.prompt_token_ids, i)
    assert prefill2.prompt_logprobs[i] == pytest.approx(fresh[start2.prompt_token_ids[i]], abs=1e-4 * math.log(2))


def test_a_plain_prefill_after_keeps_no_stale_scores(engine: Engine) -> None:
    engine.reset()
    _start_prefill(engine, CHAT, prompt_logprobs=1)
    other = (CHAT[0], Message("user", "Something else entirely."))
    _start_prefill(engine, other)  # plain: the scores past the common prefix are cut
    start, prefill = _start_prefill(engine, other, prompt_logprobs=1)
    tokens = start.prompt_token_ids
    assert prefill.reused_tokens > 0  # the common prefix's scores were kept
    assert len(prefill.prompt_logprobs) == len(tokens)
    rows = _fresh_logprobs_each(engine, tokens)
    for i in range(1, len(tokens)):  # each: this prompt's, none left from the other's
        fresh = rows[i]
        # the cache's first tokens were evaluated in another batch than the fresh run's, and
        # ggml's kernels round differently by batch size: measured up to 3.4e-4 bits here
        assert prefill.prompt_logprobs[i] == pytest.approx(fresh[tokens[i]], abs=2e-3 * math.log(2))


def test_a_prompt_that_parts_from_the_scored_one_scores_its_own_token(engine: Engine) -> None:
    """Two documents that differ in their last token only: the second's last logprob is its own
    token's (a fresh evaluation's), not the first's token's kept in the memory at that position
    (the memory held both prompts' first n tokens, and position n too: a stale score there until
    the feed recomputed the token before it)."""
    engine.reset()
    docs = ("The capital of France is Paris", "The capital of France is London")
    got = []
    for text in docs:
        events = list(engine.run_reply(ReplyRequest.document(text, ONE, prompt_logprobs=1)))
        start = next(e for e in events if isinstance(e, Start))
        got.append((start.prompt_token_ids, next(e for e in events if isinstance(e, Prefill))))
    (paris_ids, paris), (london_ids, london) = got
    assert paris_ids[:-1] == london_ids[:-1] and paris_ids[-1] != london_ids[-1]
    assert london.reused_tokens == len(london_ids) - 2  # (the token before the new one, evaluated again)
    fresh = _fresh_logprobs(engine, london_ids, len(london_ids) - 1)
    assert london.prompt_logprobs[-1] == pytest.approx(fresh[london_ids[-1]], abs=1e-4)
    assert london.prompt_logprobs[-1] != pytest.approx(paris.prompt_logprobs[-1], abs=1e-2)
    assert london.prompt_logprobs[:-1] == pytest.approx(paris.prompt_logprobs[:-1], abs=1e-6)


def test_score_only_ends_after_the_prefill_with_the_prompt_scored(engine: Engine) -> None:
    engine.reset()
    request = ReplyRequest.document("The capital of France is Paris", ONE, prompt_logprobs=1, score_only=True)
    events = list(engine.run_reply(request))
    assert [type(e).__name__ for e in events] == ["Start", "Prefill", "Finish"]
    prefill, finish = events[1], events[2]
    assert isinstance(prefill, Prefill) and prefill.prompt_logprobs is not None
    assert len(prefill.prompt_logprobs) == prefill.prompt_tokens and prefill.prompt_logprobs[-1] is not None
    assert finish.reason.value == "length" and finish.steps == finish.completion_tokens == 0 and finish.text == ""


def test_prompt_scores_round_trip_through_json(engine: Engine) -> None:
    engine.reset()
    _, prefill = _start_prefill(engine, CHAT, prompt_logprobs=2)
    assert event_from_json_dict(to_json_dict(prefill)) == prefill


def test_gemma_in_chunks_of_32_equals_a_fresh_evaluation(gemma_engine: Engine) -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 4  # 42 tokens: two chunks (32 + 10)
    gemma_engine.reset()
    events = list(gemma_engine.generate((Message("document", text),), ONE, prompt_logprobs=1))
    start = next(e for e in events if isinstance(e, Start))
    prefill = next(e for e in events if isinstance(e, Prefill))
    tokens = start.prompt_token_ids
    assert CHUNK_FLOATS // gemma_engine.n_vocab == 32 and prefill.batches == math.ceil(len(tokens) / 32) > 1
    # Gemma's Q4_K matmuls round differently by how a prefix is batched: the same prefix
    # evaluated whole and as (all but one) + one differ by up to 0.046 bits, and a chunk's
    # row against a fresh evaluation by up to 0.13 bits (measured; docs/trace-format.md).
    # A score from the wrong position or a stale one is off by bits, not hundredths
    worst = 0.0
    for i in range(1, len(tokens)):
        fresh = _fresh_logprobs(gemma_engine, tokens, i)
        worst = max(worst, abs(prefill.prompt_logprobs[i] - fresh[tokens[i]]) / math.log(2))
    assert worst < 0.25
