"""The penalties' change to the logits (sampler_penalized.change_logits): the kernel's one call
(its change_logits) against numpy's steps: the same penalized logits bit for bit, the same mass
unit, moved mass, count, bound and known maximum (to 1e-12: sums added in another order)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from sampler_paths import built_kernel

from loopchat.engine import dry, sampler_fused, sampler_penalized


def candidates(row: np.ndarray) -> SimpleNamespace:
    """What change_logits reads of sampler_stages.Candidates, fresh."""
    top = int(np.argmax(row))
    raw_max = float(row[top])
    norm = float(np.exp(row.astype(np.float64) - raw_max).sum())
    return SimpleNamespace(
        logits=row,
        work=row,
        n_vocab=row.shape[0],
        raw_max=raw_max,
        norm=norm,
        work_max=raw_max,
        work_max_id=top,
        bound=(norm, 1e-9 * norm),
    )


def changes(row: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(ids, values) as the stages make them, one after another on the same candidates: a repeat
    penalty (float32), DRY (float64 values: cast as numpy's assignment casts them), a logit bias
    that lifts a token above the maximum, one that changes that token (the known maximum's), a
    NaN, none."""
    rng = np.random.default_rng(4)
    ids = rng.choice(row.shape[0], 64, replace=False).astype(np.intp)
    v = row[ids]
    top = int(np.argmax(row))
    return [
        (ids, np.where(v > 0, v / 1.1, v * 1.1)),
        (ids[:9], row[ids[:9]].astype(np.float64) - np.linspace(0.1, 3.3, 9)),
        (np.array([5, 77], dtype=np.intp), np.array([row.max() + 3.0, -1.0], dtype=np.float32)),
        (np.array([top, 5], dtype=np.intp), np.array([row[top] - 50.0, -2.0], dtype=np.float32)),
        (np.array([8], dtype=np.intp), np.array([np.nan], dtype=np.float32)),
        (np.empty(0, dtype=np.intp), np.empty(0, dtype=np.float32)),
    ]


@pytest.mark.parametrize("n", [1_000, 49_152])
def test_the_kernels_change_logits_is_numpys(monkeypatch, n: int) -> None:
    row = (np.random.default_rng(n).standard_normal(n) * 3).astype(np.float32)
    got = []
    for kernel in (built_kernel(), None):
        monkeypatch.setattr(sampler_fused, "kernel", kernel)
        c = candidates(row.copy())
        steps = []  # (changed, moved, then the candidates' norm, bound, known maximum)
        for ids, values in changes(c.logits):
            steps.append(
                (*sampler_penalized.change_logits(c, ids, values), c.norm, *c.bound, c.work_max, c.work_max_id)
            )
        got.append((c, steps))
    (k, k_steps), (p, p_steps) = got
    assert k.work is not k.logits and np.array_equal(k.work.view(np.uint32), p.work.view(np.uint32))
    assert np.array_equal(k.logits, p.logits)  # (the model's logits untouched)
    for a, b in zip(k_steps, p_steps, strict=True):  # (after the NaN: NaN sums on both paths)
        assert a[0] == b[0] and a[-2:] == b[-2:], (a, b)
        assert a[1:-2] == pytest.approx(b[1:-2], rel=1e-12, abs=1e-15, nan_ok=True), (a, b)
    assert k_steps[0][0] > 0 and k_steps[-1][:2] == (0, 0.0)
    assert k_steps[2][-1] == 5 and k_steps[3][-2] is None  # (the lifted token; the maximum's changed)


def test_the_kernels_change_logits_refuses_an_id_outside_the_vocabulary() -> None:
    row = np.zeros(10, dtype=np.float32)
    c = candidates(row)
    with pytest.raises(IndexError):
        built_kernel().change_logits(row, row.copy(), np.array([10]), np.array([1.0], np.float32), 0.0, 1.0, False, -1)
    assert c.work is row


@pytest.mark.parametrize("penalty", [1.1, 1.3, 0.9, 2.0])
def test_the_repeat_penaltys_values_made_in_the_kernel_are_numpys(penalty: float) -> None:
    """change_logits with values None (the repeat penalty's: v / penalty where v > 0, else v *
    penalty) changes the logits and the mass unit exactly as the values numpy's np.where makes,
    passed in: every figure the same bits, on logits of both signs, zeros among them."""
    kernel = built_kernel()
    rng = np.random.default_rng(11)
    row = (rng.standard_normal(5000) * 6).astype(np.float32)
    ids = rng.choice(row.shape[0], 64, replace=False).astype(np.intp)
    row[ids[:3]] = [0.0, -0.0, 1e-30]
    got, want = candidates(row.copy()), candidates(row.copy())
    old = sampler_fused.kernel
    try:
        sampler_fused.kernel = kernel
        g = sampler_penalized.change_logits(got, ids, None, penalty)
        v = want.work[ids]
        w = sampler_penalized.change_logits(want, ids, np.where(v > 0, v / penalty, v * penalty))
        sampler_fused.kernel = None  # (numpy's path: the same values made there)
        n = candidates(row.copy())
        ref = sampler_penalized.change_logits(n, ids, None, penalty)
    finally:
        sampler_fused.kernel = old
    assert g == w and got.work.tobytes() == want.work.tobytes() and got.norm == want.norm
    assert got.bound == want.bound and got.work_max == want.work_max
    assert n.work.tobytes() == want.work.tobytes() and ref[0] == w[0]


def test_the_repeat_penaltys_tokens_are_the_same_on_both_paths(monkeypatch) -> None:
    """recent_ids: the kernel's call over a History's int64 tail gives the distinct ids within the
    vocabulary in the order each first comes, as Python's dict over a plain list does: repeats, ids
    outside the vocabulary (negative, too large), a window longer than the context, one longer than
    the kernel's table on the stack (2,048 tokens)."""
    built_kernel()
    rng = np.random.default_rng(9)
    n_vocab = 500
    for size, last_n in ((0, 64), (1, 64), (40, 64), (200, 64), (300, 1000), (5000, 3000)):
        tokens = rng.integers(-20, n_vocab + 20, size).tolist()
        history = dry.History(tokens)
        got = sampler_penalized.recent_ids(history, last_n, n_vocab)
        window = tokens[-last_n:] if size else []
        want = list(dict.fromkeys(t for t in window if 0 <= t < n_vocab))
        assert got.dtype == np.int64 and got.tolist() == want, (size, last_n)
        assert sampler_penalized.recent_ids(tokens, last_n, n_vocab).tolist() == want  # (a plain list: Python's)
    monkeypatch.setattr(sampler_fused, "kernel", None)
    assert sampler_penalized.recent_ids(dry.History([3, 1, 3, 2, 1]), 64, n_vocab).tolist() == [3, 1, 2]
