"""DRY (dry.py): llama.cpp's own test cases, a brute-force reimplementation on random
token lists, the sampler's hook, and the real model's steps recomputed from their events."""

from __future__ import annotations

import math
import random
import time

import numpy as np
import pytest

from loopchat.engine import dry, sampler
from loopchat.engine.engine import Engine
from loopchat.events import Message, Start, Step
from loopchat.settings import SamplingSettings


def brute(ctx: list[int], breakers: set[int], mult: float, base: float, allowed: int, last_n: int) -> dict[int, float]:
    """DRY as docs/trace-format.md words it, one position at a time, no Z-algorithm."""
    if mult == 0 or base < 1 or last_n == 0:
        return {}
    n = len(ctx) if last_n < 0 else min(len(ctx), last_n)
    if n <= allowed:
        return {}
    a = ctx[len(ctx) - n :]
    limit = n  # tokens after the last breaker
    for back in range(n):
        if a[n - 1 - back] in breakers:
            limit = back
            break
    if limit < allowed:
        return {}
    longest: dict[int, int] = {}
    for e in range(n - 1):  # the sequence ending at e, against the one ending the context
        length = 0
        while length <= e and a[e - length] == a[n - 1 - length]:
            length += 1
        length = min(length, limit)
        if length >= allowed:
            longest[a[e + 1]] = max(longest.get(a[e + 1], -1), length)
    b32, m32 = float(np.float32(base)), float(np.float32(mult))
    max_exp = int(np.float32(88.7228391) / np.float32(math.log(b32))) if b32 > 1.000001 else 0
    out = {}
    for t, length in longest.items():
        if t not in breakers:
            x = length - allowed
            x = min(x, max_exp) if max_exp > 0 else x
            out[t] = float(np.float32(m32 * b32**x))
    return out


def test_matches_a_brute_force_reimplementation_on_random_token_lists() -> None:
    rng = random.Random(7)
    penalized = 0
    for _ in range(4000):
        vocab = rng.choice([2, 3, 5, 20])
        ctx = [rng.randrange(vocab) for _ in range(rng.randrange(0, 80))]
        breakers = set(rng.sample(range(vocab), rng.choice([0, 0, 1, 2]))) if vocab > 2 else set()
        args = (
            rng.choice([0.0, 0.8, 2.0]),
            rng.choice([0.5, 1.0, 1.75, 3.0]),
            rng.choice([0, 1, 2, 3, 5]),
            rng.choice([-1, 0, 5, 64]),
        )
        ids, pen = dry.penalties(ctx, frozenset(breakers), *args)
        got = dict(zip(ids.tolist(), pen.tolist()))
        assert got == brute(ctx, breakers, *args), (ctx, breakers, args)
        penalized += bool(got)
    assert penalized > 500  # many cases did penalize something (not only the empty answers)


def test_a_historys_tail_follows_every_change_and_gives_the_lists_penalties() -> None:
    """History.tail (the last n tokens as int64, kept beside the list, DRY's reading of the context):
    after appends, extends and every other change (a slice set, a deletion, a pop, an insert, a clear),
    the list's own tokens; and penalties over a History equal those over its plain list, step by step."""
    rng = random.Random(24)
    history, plain = dry.History([1, 2, 3]), [1, 2, 3]
    changes = [
        lambda h: h.append(rng.randrange(6)),
        lambda h: h.extend([rng.randrange(6) for _ in range(rng.randrange(4))]),
        lambda h: h.__setitem__(slice(0, 2), [5, 5, 5]),
        lambda h: h.__setitem__(0, 4),
        lambda h: h.__delitem__(slice(len(h) // 2, None)),
        lambda h: h.pop() if h else None,
        lambda h: h.insert(1, 3),
        lambda h: h.remove(h[0]) if h else None,
        lambda h: h.sort(),
        lambda h: h.reverse(),
        lambda h: h.clear(),
    ]
    for step in range(3000):
        change = changes[0] if step % 3 else rng.choice(changes)
        state = rng.getstate()
        change(history)
        rng.setstate(state)
        change(plain)
        assert list(history) == plain
        n = rng.randrange(len(plain) + 1)
        assert history.tail(n).tolist() == plain[len(plain) - n :], step
        args = (frozenset({0}), 0.8, 1.75, 2, rng.choice([-1, 5, 64]))
        a, b = dry.penalties(history, *args), dry.penalties(plain, *args)
        assert a[0].tolist() == b[0].tolist() and a[1].tobytes() == b[1].tobytes(), step


def test_a_long_repeat_reaches_the_exponent_clamp() -> None:
    ctx = [1, 2] * 200  # a 398-token repeat: 1.75 ** 396 would overflow a float
    ids, pen = dry.penalties(ctx, frozenset(), 0.8, 1.75, 2, -1)
    assert ids.tolist() == [1]
    max_exp = int(np.float32(88.7228391) / np.float32(math.log(np.float32(1.75))))
    assert pen[0] == np.float32(0.8 * 1.75**max_exp) and np.isfinite(pen[0])


def _llama_case(
    probs: list[float], tokens: list[int], breakers: set[int], mult: float, base: float, allowed: int, last_n: int
) -> list[float]:
    """test-sampling.cpp's test_dry: logits log(p), DRY, then softmax."""
    logits = np.log(np.asarray(probs, dtype=np.float32))
    ids, pen = dry.penalties(tokens, frozenset(breakers), mult, base, allowed, last_n)
    logits[ids] -= pen
    e = np.exp(logits.astype(np.float64) - logits.max())
    return (e / e.sum()).tolist()


@pytest.mark.parametrize(
    "probs,tokens,expected,mult,base,allowed,last_n,breakers",
    [  # llama.cpp's tests/test-sampling.cpp, test_dry, every case
        ([0.25] * 4, [0, 1], [0.25] * 4, 1.0, 1.1, 2, 4, set()),
        ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, set()),
        ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, {3}),
        ([0.2] * 5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818], 2.0, 1.1, 2, 5, set()),
        ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, set()),
    ],
)
def test_llama_cpps_own_cases(probs, tokens, expected, mult, base, allowed, last_n, breakers) -> None:
    assert _llama_case(probs, tokens, breakers, mult, base, allowed, last_n) == pytest.approx(expected, abs=1e-5)


class _Vocab:
    """A vocabulary of five pieces (what dry.model_breakers reads of a model)."""

    n_vocab = 5

    def piece(self, i: int) -> bytes:
        return [b" the", b" cat", b".\n", b" sat", b":"][i]


def test_the_sampler_subtracts_the_penalties_after_the_repeat_penalty() -> None:
    vocab = _Vocab()
    assert dry.model_breakers(vocab) == {2, 4}
    logits = np.array([1.0, 2.0, 0.5, 1.5, 0.0], dtype=np.float32)
    history = dry.History([0, 1, 3, 2, 0, 1, 3, 0, 1], vocab)  # " the cat" again: " sat" would extend it
    s = SamplingSettings(
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
        repeat_penalty=1.0,
        dry_multiplier=0.8,
        dry_base=1.75,
        dry_allowed_length=2,
        dry_penalty_last_n=64,
    )
    res = sampler.sample(logits, history, s, sampler.make_rng(0), report_k=5)
    # " the cat" ends the context and came before " sat" at 1-2 and 5-6; after the breaker
    # ".\n" (position 3) only 5 tokens count: the longest match is 2 tokens, penalty 0.8
    want = logits.astype(np.float64).copy()
    want[3] -= np.float32(0.8)
    p = np.exp(want - want.max())
    p /= p.sum()
    got = dict(zip(res.sampled_top_ids.tolist(), res.sampled_top_probs.tolist()))
    assert got == pytest.approx({i: p[i] for i in range(5)}, abs=1e-7)
    # the repeat penalty comes first: 1.5 / 1.2 = 1.25, then DRY's 0.8
    res = sampler.sample(logits, history, s.replace(repeat_penalty=1.2), sampler.make_rng(0), report_k=5)
    got = dict(zip(res.sampled_top_ids.tolist(), res.sampled_top_probs.tolist()))
    want = np.array([1.0 / 1.2, 2.0 / 1.2, 0.5 / 1.2, 1.5 / 1.2 - 0.8, 0.0], dtype=np.float32).astype(np.float64)
    q = np.exp(want - want.max())
    assert got[3] == pytest.approx(q[3] / q.sum(), abs=1e-6)
    # DRY is the chain's stage after the repeat penalty; it removes no candidate
    assert [r.stage for r in res.stages][:2] == ["repeat_penalty", "dry"] and res.stages[1].removed == 0
    # DRY off: no penalties, the logits left alone
    assert dry.step_penalties(history, s.replace(dry_multiplier=0.0), logits.shape[0])[0].size == 0


def test_a_step_costs_little_on_a_long_context() -> None:
    """A 4,096-token context (a 512-token reply looping on a 3,584-token prompt), one
    step's penalties: about 0.5 ms measured (best of 20), a bound 40 times that so that a
    busy machine does not fail it, still below one forward pass of the bundled model."""
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, 49152, 3584).tolist()
    loop = rng.integers(0, 49152, 40).tolist()
    ctx = prompt + (loop * 13)[:512]
    breakers = frozenset(range(0, 49152, 97))  # ~1% of the vocabulary, none in the loop
    ctx = [t + 1 if t in breakers else t for t in ctx]
    best = math.inf
    for _ in range(20):
        t0 = time.perf_counter()
        ids, _pen = dry.penalties(ctx, breakers, 0.8, 1.75, 2, -1)
        best = min(best, time.perf_counter() - t0)
    assert ids.size >= 1
    assert best < 0.02, f"{best * 1000:.2f} ms"


class _CountedVocab:
    """A vocabulary of 5,000 pieces, every 7th holding a newline; counts the pieces read."""

    n_vocab = 5000

    def __init__(self) -> None:
        self.read = 0

    def piece(self, i: int) -> bytes:
        self.read += 1
        return b"a\nb" if i % 7 == 0 else b" w%d" % i


def test_dry_looks_up_only_the_tokens_it_meets_and_answers_as_the_whole_vocabularys_set() -> None:
    """A reply's DRY steps read the breakers through the model's BreakerTable: each token looked
    up the first time a context or a candidate holds it, not the whole vocabulary before the
    first step (~0.3 s on the default model, ~1.6 s on Gemma's 262,144 pieces, on every launch)."""
    rng = random.Random(5)
    vocab = _CountedVocab()
    table = dry.breaker_table(vocab)
    assert dry.breaker_table(vocab) is table and dry.History([1], vocab).breakers is table
    contexts = [[rng.choice(range(0, 60)) for _ in range(rng.randint(3, 80))] for _ in range(200)]
    for ctx in contexts:
        got = dry.penalties(ctx, table, 0.8, 1.75, 2, -1)
        assert vocab.read <= 60  # the ids met so far, each once
        want = dry.penalties(ctx, frozenset(i for i in range(60) if i % 7 == 0), 0.8, 1.75, 2, -1)
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
    whole = dry.model_breakers(vocab)  # (every piece read)
    every = np.arange(-3, vocab.n_vocab + 3)
    assert table.mask(every).tolist() == [int(i) in whole for i in every]
    assert 7 in table and 8 not in table and -1 not in table and "7" not in table


@pytest.mark.model
def test_the_real_models_sampled_distribution_is_the_raw_one_minus_the_penalties(engine: Engine) -> None:
    """Temperature T over the whole vocabulary: the sampled distribution is
    softmax((logits - penalty) / T), so T log(sampled p) - log(raw p) + penalty is the
    same number for every token both top lists show; the penalties recomputed from the Start event's
    prompt ids and the steps' tokens, with the model's own breakers."""
    s = SamplingSettings(
        temperature=0.5,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
        repeat_penalty=1.0,
        seed=11,
        max_tokens=160,
        dry_multiplier=0.8,
        dry_base=1.75,
        dry_allowed_length=2,
        dry_penalty_last_n=4096,
    )
    msgs = [Message("user", "Tell me a short story about a cat.")]
    engine.reset()
    events = list(engine.generate(msgs, s))
    start = next(e for e in events if isinstance(e, Start))
    steps = [e for e in events if isinstance(e, Step)]
    breakers = dry.model_breakers(engine)
    assert engine.tokenize("\n")[-1] in breakers and engine.tokenize(" cat")[-1] not in breakers
    ctx = list(start.prompt_token_ids)
    checked = 0
    for st in steps:
        ids, pen = dry.penalties(ctx, breakers, 0.8, 1.75, 2, 4096)
        penalty = dict(zip(ids.tolist(), pen.tolist()))
        raw = {c.token_id: c.prob for c in st.raw_top}
        both = [(c.token_id, c.prob) for c in st.sampled_top if c.token_id in raw and raw[c.token_id] > 1e-6]
        shifts = [0.5 * math.log(p) - math.log(raw[t]) + penalty.get(t, 0.0) for t, p in both]
        assert max(shifts) - min(shifts) < 1e-3, (st.index, both, penalty)
        checked += any(t in penalty for t, _ in both)
        ctx.append(st.token_id)
    assert checked >= 5, "".join(st.text for st in steps)  # penalized tokens shown at several steps


def test_the_tables_lookup_knows_every_breaker_of_breakers() -> None:
    """BreakerTable's lookup tests a piece for each of dry.BREAKERS (spelled out, not a loop over them):
    a piece holding any one of them, alone, at either end or inside, is a breaker; others are not."""

    class Pieces:
        pieces = [
            b" the",
            b"cat",
            b"",
            b"\xff\xfe",
            *(p for b in dry.BREAKERS for p in (b, b"x" + b, b + b"y", b"a" + b + b"z")),
        ]
        n_vocab = len(pieces)

        def piece(self, i: int) -> bytes:
            return self.pieces[i]

    vocab = Pieces()
    table = dry.BreakerTable(vocab)
    every = np.arange(vocab.n_vocab)
    assert table.mask(every).tolist() == [i >= 4 for i in range(vocab.n_vocab)]
    assert set(np.flatnonzero(table.mask(every)).tolist()) == dry.model_breakers(vocab)
