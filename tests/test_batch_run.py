"""Parallel sequences in the engine (issue 25, item 2): N replies to one prompt in one batch,
on the real default model.

Exactness is checked on an engine with flash attention on: there a batched pass's row is bit
for bit the single-sequence pass's (measured: 0.0 difference). With flash attention off (the
default model's measured default), llama.cpp's own prefill is exact too (the batch-invariant
build: tests/test_batch_invariance.py), but a batch of sequences is not: in the unified KV cache
the sequences' cells interleave, and attention without flash attention sums over every cell (the
other sequences' at weight 0) in SIMD lanes set by the cell's index, so one sequence's terms are
added in another order than alone (docs/trace-format.md, "Parallel sequences"); there the
structure is checked, and the difference named by test_flash_attention_off_differs_in_a_batch_of_sequences_only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from loopchat.batch import SEQUENCES_MAX, split_by_sequence
from loopchat.engine.engine import Engine
from loopchat.errors import ContextOverflowError, EngineError
from loopchat.events import Finish, FinishReason, Message, Prefill, Start, Step
from loopchat.settings import SamplingSettings
from loopchat.step_control import StepControl

pytestmark = pytest.mark.model

MESSAGES = (Message("user", "Write one sentence about the sea."),)


@pytest.fixture(scope="module")
def fa_on(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The default model with flash attention on: batched rows exact (see the module's doc)."""
    eng = Engine(model_path, n_ctx=1024, threads=1, log_path=tmp_path_factory.mktemp("log") / "l.log", flash_attn="on")
    yield eng
    eng.close()


def _softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    p = np.exp(x - x.max())
    return p / p.sum()


def _worst_against_alone(engine: Engine, prompt: list[int], steps: list[Step]) -> float:
    """The largest difference between a step's raw probabilities (its top list and its token's)
    and those of a fresh single-sequence evaluation of its prefix: the plain loop's passes."""
    engine.reset()
    engine.evaluate(prompt)
    worst = 0.0
    for i, step in enumerate(steps):
        probs = _softmax(engine.logits())
        worst = max([worst, abs(probs[step.token_id] - (step.raw_prob or 0.0))])
        worst = max([worst, *(abs(probs[c.token_id] - c.prob) for c in step.raw_top)])
        if i + 1 < len(steps):
            engine.forward(step.token_id)
    engine.reset()
    return worst


def _replies(events: list, n: int) -> list[tuple[Start, list[Step], Finish]]:
    out = []
    for part in split_by_sequence(events, n):
        start = next(e for e in part if isinstance(e, Start))
        finish = next(e for e in part if isinstance(e, Finish))
        out.append((start, [e for e in part if isinstance(e, Step)], finish))
    return out


def test_n4_at_temperature_0_is_one_reply_four_times(fa_on: Engine) -> None:
    settings, engine = SamplingSettings(temperature=0.0, max_tokens=24), fa_on
    engine.reset()
    events = list(engine.generate(MESSAGES, settings, n=4))
    prompt = next(e for e in events if isinstance(e, Start)).prompt_token_ids
    assert engine.n_past == len(prompt)  # the cache left holding the prompt, as after a reply alone
    alone = [e for e in engine.generate(MESSAGES, settings) if isinstance(e, (Prefill, Finish))]
    assert alone[0].reused_tokens == len(prompt) - 1  # ... which the next reply reuses

    assert [e.kind for e in events[:5]] == ["start"] * 4 + ["prefill"]
    assert sum(isinstance(e, Prefill) for e in events) == 1  # the prompt evaluated once
    replies = _replies(events, 4)
    for j, (start, steps, finish) in enumerate(replies):
        assert (start.sequence, start.sequences, finish.sequence) == (j, 4, j)
        assert finish.text == alone[-1].text, f"sequence {j} differs from the reply alone"
        assert finish.reason == alone[-1].reason and finish.steps == len(steps)
        assert [s.index for s in steps] == list(range(len(steps)))
        assert steps[0].batch is None  # drawn from the prefill's logits
        for s in steps[1:]:  # every other step: the batched pass that gave its logits
            assert s.batch is not None and s.batch.size == s.forward_tokens == 4
            assert s.forward_ms == s.batch.ms > 0 and s.batch.single_ms is not None and s.batch.single_ms > 0
    # passes in order, each step of a pass before the next pass's
    numbers = [e.batch.number for e in events if isinstance(e, Step) and e.batch is not None]
    assert numbers == sorted(numbers) and numbers[0] == 1


def test_every_step_is_what_one_sequence_alone_shows(fa_on: Engine) -> None:
    """At temperature > 0, each sequence's own random stream (seed + index), and every step's raw
    probabilities equal to 1e-4 those of a fresh single-sequence evaluation of its prefix."""
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11, max_tokens=20)
    replies = _replies(list(fa_on.generate(MESSAGES, settings, n=3)), 3)
    prompt = list(replies[0][0].prompt_token_ids or ())
    assert len({f.text for _, _, f in replies}) > 1, "three draws at temperature 1 gave one text"
    for j, (start, steps, _) in enumerate(replies):
        assert start.settings.seed == 11 + j and all(s.settings.seed == 11 + j for s in steps)
        worst = _worst_against_alone(fa_on, prompt, steps)
        assert worst < 1e-4, f"sequence {j}: a raw probability {worst:.2e} from the single-sequence one"


def test_flash_attention_off_differs_in_a_batch_of_sequences_only(engine: Engine) -> None:
    """Flash attention off: llama.cpp's own prefill (one sequence's rows in one batch) gives each row
    the one-position pass's logits bit for bit (the Makefile's patched build; the stock
    wheel's differed by up to 3.3e-2 in a probability), while a batch of sequences differs from the
    sequence alone (the unified cache's interleaved cells: the module's doc), measured up to 3e-2."""
    assert engine.flash_attn == "off"
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11, max_tokens=20)
    replies = _replies(list(engine.generate(MESSAGES, settings, n=3)), 3)
    prompt = list(replies[0][0].prompt_token_ids or ())
    batched = max(_worst_against_alone(engine, prompt, steps) for _, steps, _ in replies)
    tokens = prompt + [s.token_id for s in replies[0][1]]
    engine.reset()
    rows = engine.evaluate_scored(tokens).copy()
    engine.reset()
    prefill = 0.0
    for i in range(len(tokens)):
        engine.evaluate(tokens[: i + 1]) if i == 0 else engine.forward(tokens[i])
        prefill = max(prefill, float(np.abs(_softmax(rows[i]) - _softmax(engine.logits())).max()))
    engine.reset()
    assert prefill == 0.0, (
        f"llama.cpp's own prefill {prefill:.2e} from one row at a time: a wheel without the Makefile's patch?"
    )
    assert batched > 0, "a batch of sequences gave each its rows alone bit for bit: say so (docs/trace-format.md)"


def test_a_sequence_is_the_reply_alone_with_its_seed(fa_on: Engine) -> None:
    """Sequence j of a batch seeded s draws what a reply alone seeded s + j draws (a draw can
    differ only where the batched pass's last bits moved a boundary: said, not hidden)."""
    settings = SamplingSettings(temperature=0.8, seed=40, max_tokens=16)
    batch = _replies(list(fa_on.generate(MESSAGES, settings, n=2)), 2)
    for j, (_, steps, _) in enumerate(batch):
        alone = [e for e in fa_on.generate(MESSAGES, settings.replace(seed=40 + j)) if isinstance(e, Step)]
        flips = [
            (i, a.token_id, b.token_id, a.raw_prob, b.raw_prob)
            for i, (a, b) in enumerate(zip(steps, alone))
            if a.token_id != b.token_id
        ]
        assert not flips, f"sequence {j}: first flip (step, batch token, alone token, probs): {flips[0]}"
        assert len(steps) == len(alone)


def test_requests_it_cannot_run_are_refused_in_one_line(engine: Engine) -> None:
    settings = SamplingSettings(temperature=0.0, max_tokens=600)
    cases = [
        (dict(n=SEQUENCES_MAX + 1), EngineError, f"from 1 to {SEQUENCES_MAX}"),
        (dict(n=0), EngineError, "from 1 to"),
        (dict(n=4), ContextOverflowError, "ask for n at most 3, or max_tokens at most"),
        (dict(n=2, control=StepControl(paused=True)), EngineError, "step mode"),
        (dict(n=2, step_paused=True), EngineError, "step mode"),
        (dict(n=2, lens=True), EngineError, "lens"),
    ]
    for fields, error, words in cases:
        with pytest.raises(error) as info:
            next(iter(engine.generate(MESSAGES, settings, **fields)))
        assert words in str(info.value) and "\n" not in str(info.value)


def test_a_cancel_ends_every_sequence(engine: Engine) -> None:
    settings = SamplingSettings(temperature=1.0, seed=3, max_tokens=200)
    events = []
    for event in engine.generate(MESSAGES, settings, n=3, ignore_eos=True):
        events.append(event)
        if isinstance(event, Step) and event.index == 3 and event.sequence == 2:
            engine.cancel()
    finishes = [e for e in events if isinstance(e, Finish)]
    assert sorted(f.sequence for f in finishes) == [0, 1, 2]
    assert all(f.reason == FinishReason.CANCELLED for f in finishes)
    prompt = next(e for e in events if isinstance(e, Start)).prompt_token_ids
    assert engine.n_past == len(prompt or ())


def test_the_rows_of_a_pass_are_the_rows_asked_one_by_one(engine: Engine) -> None:
    """BatchCalls.rows (one llama_get_logits_ith call a pass: llama.h's rows in the batch's order)
    gives the very rows llama_get_logits_ith gives each token, for passes of 1 to 5 sequences."""
    from loopchat.engine._batch_ffi import BatchCalls

    engine.reset()
    prompt = engine.tokenize("The sea is")
    engine.evaluate(prompt)
    calls = BatchCalls(engine.llm, engine.n_vocab)
    try:
        for n in range(1, 6):
            for seq in range(1, n + 1):
                calls.copy(0, seq, -1)
            assert calls.decode([(seq, 1000 + 7 * seq, len(prompt)) for seq in range(1, n + 1)]) == 0
            rows = calls.rows(n)
            assert len(rows) == n
            for i in range(n):
                one = calls.row(i)
                assert rows[i].ctypes.data == one.ctypes.data and np.array_equal(rows[i], one)
            assert not np.array_equal(rows[0], rows[-1]) or n == 1  # (distinct tokens: distinct rows)
            for seq in range(1, n + 1):
                calls.remove(seq, 0)
    finally:
        calls.close()
        engine.reset()
