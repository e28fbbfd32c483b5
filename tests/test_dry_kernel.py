"""DRY's repeats in the C kernel (dry_longest: the reversed context's Z-array, one call) against
numpy's blocks of offsets (dry._longest_numpy): the same tokens and the same longest repeats, so
the same penalties, on random contexts and on long ones that repeat themselves."""

from __future__ import annotations

import random

import numpy as np
import pytest
from sampler_paths import built_kernel

from loopchat.engine import dry, sampler_fused


def _both(
    a: list[int], rep_limit: int, allowed: int
) -> tuple[tuple[list[int], list[int]], tuple[list[int], list[int]]]:
    arr = np.asarray(a, dtype=np.int64)
    got = dry._longest_kernel(arr, rep_limit, allowed)
    assert got is not None
    want = dry._longest_numpy(arr, rep_limit, allowed)
    return (got[0].tolist(), got[1].tolist()), (want[0].tolist(), want[1].tolist())


def test_the_kernels_repeats_are_numpys_on_random_contexts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_fused, "kernel", built_kernel())
    rng = random.Random(24)
    found = 0
    for _ in range(3000):
        vocab = rng.choice([1, 2, 3, 5, 20, 50_000])
        a = [rng.randrange(vocab) for _ in range(rng.randrange(2, 120))]
        rep_limit = rng.choice([0, 1, 2, 3, len(a) // 2, len(a)])
        allowed = rng.choice([0, 1, 2, 3, 5])
        got, want = _both(a, rep_limit, allowed)
        assert got == want, (a, rep_limit, allowed)
        found += bool(got[0])
    assert found > 1000


def test_the_kernels_repeats_are_numpys_on_long_repeating_contexts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_fused, "kernel", built_kernel())
    rng = random.Random(7)
    for period in (1, 2, 7, 64, 301):
        block = [rng.randrange(1000) for _ in range(period)]
        a = (block * (2048 // period + 1))[:2048]
        a[rng.randrange(2048)] = 5000  # one break in the repeat somewhere
        for rep_limit in (2048, 1000, 3):
            got, want = _both(a, rep_limit, 2)
            assert got == want, (period, rep_limit)
            assert got[0]


def test_the_penalties_are_the_same_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    for _ in range(500):
        vocab = rng.choice([2, 3, 5, 20])
        ctx = [rng.randrange(vocab) for _ in range(rng.randrange(0, 200))]
        breakers = frozenset(rng.sample(range(vocab), rng.choice([0, 1]))) if vocab > 2 else frozenset()
        args = (0.8, 1.75, rng.choice([0, 1, 2, 3]), rng.choice([-1, 5, 64]))
        monkeypatch.setattr(sampler_fused, "kernel", None)
        want = dry.penalties(ctx, breakers, *args)
        monkeypatch.setattr(sampler_fused, "kernel", built_kernel())
        got = dry.penalties(ctx, breakers, *args)
        assert got[0].tolist() == want[0].tolist() and got[1].tobytes() == want[1].tobytes(), (ctx, breakers, args)


class _Vocab:
    """A vocabulary of 5,000 pieces, every 7th holding a colon."""

    n_vocab = 5000

    def piece(self, i: int) -> bytes:
        return b"a:" if i % 7 == 0 else b" w%d" % i


@pytest.mark.parametrize("path", ["kernel", "numpy"])
def test_the_last_breaker_is_found_from_the_end_as_the_mask_finds_it(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BreakerTable.last_in (the kernel's pass from the end, tokens looked up as they are met) and
    its few-token mask give what the whole mask gives, whatever the table has looked up so far;
    ids outside the vocabulary are no breakers."""
    monkeypatch.setattr(sampler_fused, "kernel", built_kernel() if path == "kernel" else None)
    rng = random.Random(9)
    vocab = _Vocab()
    table = dry.BreakerTable(vocab)
    for _ in range(400):
        ctx = np.array([rng.choice([-2, 5000, *range(0, 300)]) for _ in range(rng.randint(0, 60))], dtype=np.int64)
        flags = [0 <= int(t) < 5000 and int(t) % 7 == 0 for t in ctx]
        want = max((i for i, f in enumerate(flags) if f), default=-1)
        assert table.last_in(ctx) == want, ctx
        few = ctx[:16]
        assert table.mask(few).tolist() == flags[:16]
