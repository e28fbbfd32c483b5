"""The seed: random per reply unless pinned, and always recorded, so a reply replays exactly."""

from __future__ import annotations

import pytest

from loopchat.engine.engine import Engine
from loopchat.events import Message, Prefill, Start, Step
from loopchat.settings import LiveSettings, SamplingSettings, SettingsError

pytestmark = pytest.mark.model

MESSAGES = (Message("user", "Write one sentence about cats."),)


def run(engine: Engine, settings) -> tuple[Start, list[Step]]:
    events = list(engine.generate(MESSAGES, settings))
    start = next(e for e in events if isinstance(e, Start))
    return start, [e for e in events if isinstance(e, Step)]


def test_the_default_seed_is_drawn_per_reply_and_recorded(engine: Engine) -> None:
    settings = SamplingSettings(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, max_tokens=12)
    assert settings.seed is None
    replies = []
    for _ in range(3):
        # from an empty cache each time: a prompt prefilled in other batches than before
        # gives logits that differ in their last bits, enough to change a draw at T=1.5
        engine.reset()
        replies.append(run(engine, settings))
    seeds = [start.settings.seed for start, _ in replies]
    assert all(isinstance(s, int) and 0 <= s < 2**32 for s in seeds)
    assert len(set(seeds)) == 3  # three replies, three seeds (2**-32 odds of a clash)
    for start, steps in replies:
        assert {s.settings.seed for s in steps} == {start.settings.seed}
    assert len({tuple(s.token_id for s in steps) for _, steps in replies}) > 1
    # the recorded settings give the same tokens again
    start, steps = replies[0]
    engine.reset()
    again = run(engine, start.settings)[1]
    assert [s.token_id for s in again] == [s.token_id for s in steps]


def test_a_pinned_seed_stays_and_a_mid_reply_swap_keeps_the_replys_seed(engine: Engine) -> None:
    start, steps = run(engine, SamplingSettings(seed=1234, max_tokens=6))
    assert start.settings.seed == 1234 and {s.settings.seed for s in steps} == {1234}
    live = LiveSettings(SamplingSettings(temperature=1.2, max_tokens=10))
    seen = []
    for event in engine.generate(MESSAGES, live):
        if isinstance(event, Step):
            seen.append(event.settings)
            if event.index == 2:
                live.update(temperature=0.5)  # swapped whole, the seed still unpinned
    assert len({s.seed for s in seen}) == 1
    assert seen[-1].temperature == 0.5


def test_seed_values() -> None:
    assert SamplingSettings().to_dict()["seed"] is None
    assert SamplingSettings.from_dict({"seed": None}).seed is None
    assert SamplingSettings(seed=5).with_seed(9).seed == 5
    assert SamplingSettings().with_seed(9).seed == 9
    for bad in (-1, 2**32, 1.5, "x"):
        try:
            SamplingSettings(seed=bad)
        except SettingsError as exc:
            assert "seed" in str(exc) and "e+" not in str(exc)
            if bad in (-1, 2**32):
                assert "between 0 and 4294967295" in str(exc)
        else:
            raise AssertionError(f"seed={bad!r} accepted")


def test_a_replay_capped_at_the_original_reuse_draws_the_same_tokens(engine: Engine) -> None:
    """F9 replays a reply with its recorded settings. With the whole prompt in the KV
    cache, evaluating only its last token gives logits that differ in their last bits
    from the first prefill's, enough to change a draw at T=1.5 over the whole vocabulary;
    capped at the original reuse, the prompt is evaluated in the same batches again."""
    settings = SamplingSettings(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, max_tokens=24)
    engine.reset()
    first = list(engine.generate(MESSAGES, settings))
    start = next(e for e in first if isinstance(e, Start))
    prefill = next(e for e in first if isinstance(e, Prefill))
    tokens = [e.token_id for e in first if isinstance(e, Step)]
    for _ in range(3):
        again = list(engine.generate(MESSAGES, start.settings, reuse_at_most=prefill.reused_tokens))
        assert next(e for e in again if isinstance(e, Prefill)).reused_tokens == prefill.reused_tokens
        assert [e.token_id for e in again if isinstance(e, Step)] == tokens
