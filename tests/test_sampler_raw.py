"""The raw softmax's fused pass (sampler_raw, the kernel's raw_sums and raw_exp): numpy's
float32 bits, not merely close: its exp over a dense sweep of the arguments the sampler
passes, its sums on recorded rows of both models and on rows made to break it, the guard
that keeps numpy's passes where the kernel does not match them. (The whole chain on both
paths against tests/reference_sampler.py: test_sampler_chain.py and test_sampler_kernel.py.)"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
from sampler_paths import built_kernel
from test_sampler_chain import S, gemma_rows, smol_rows  # noqa: F401 (fixtures)

from loopchat.engine import sampler, sampler_fused, sampler_raw


def bits(x: float) -> bytes:
    return np.float64(x).tobytes()


def numpy_raw(row: np.ndarray) -> tuple[float, float, np.ndarray]:
    """sampler.sample's raw softmax as numpy computed it (tests/reference_sampler.py's)."""
    s = row - np.float32(float(row.max()))
    e = np.exp(s)
    return float(e.sum()), float(np.einsum("i,i->", e, s)), e


def assert_numpys_bits(row: np.ndarray) -> None:
    k = built_kernel()
    m = float(row.max())
    total, dot = k.raw_sums(row, m)
    want_total, want_dot, e = numpy_raw(row)
    assert bits(total) == bits(want_total), (row.shape, total, want_total)
    assert bits(dot) == bits(want_dot) or (np.isnan(dot) and np.isnan(want_dot)), (row.shape, dot, want_dot)
    got = np.empty_like(row)
    k.raw_exp(row, m, got)
    assert np.array_equal(got.view(np.uint32), e.view(np.uint32))


def test_the_fused_raw_pass_passed_its_probe_here() -> None:
    """This CPU has AVX2 and FMA and numpy is 2.4: the kernel matched, the chain uses it."""
    if os.environ.get("LOOPCHAT_SAMPLER_KERNEL") == "0":
        pytest.skip("LOOPCHAT_SAMPLER_KERNEL=0: the numpy path only")
    assert sampler_raw.RAW_FUSED


def test_the_fused_exp_is_numpys_over_a_dense_sweep_of_the_arguments() -> None:
    """Every 13th float32 from -0 down to -104.5 (past numpy's cutoff at -103.97, through
    the subnormal results below -87.3), and the special values, bit for bit."""
    lo = int(np.array([-104.5], dtype=np.float32).view(np.uint32)[0])
    k = built_kernel()
    for first in range(0x80000000, lo + 1, 13 << 22):
        x = np.arange(first, min(first + (13 << 22), lo + 1), 13, dtype=np.uint32).view(np.float32)
        got = np.empty_like(x)
        k.raw_exp(x, 0.0, got)
        assert np.array_equal(got.view(np.uint32), np.exp(x).view(np.uint32)), first
    special = np.array([0.0, -0.0, -np.inf, np.nan, 88.0, 89.0, np.inf, -1e-45, -3.4e38], dtype=np.float32)
    got = np.empty_like(special)
    k.raw_exp(special, 0.0, got)
    with np.errstate(over="ignore"):
        assert np.array_equal(got.view(np.uint32), np.exp(special).view(np.uint32))


def adversarial_rows() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(23)
    rows = {f"len{n}": (rng.standard_normal(n) * 4).astype(np.float32) for n in (1, 2, 7, 9, 15, 17, 127, 129, 255)}
    rows |= {f"len{n}": (rng.standard_normal(n) * 4).astype(np.float32) for n in (1001, 8199, 24_577, 262_143)}
    rows["ties"] = np.repeat(rng.standard_normal(40).astype(np.float32), 333)
    rows["flat"] = np.full(50_001, 3.25, dtype=np.float32)
    rows["one-hot"] = np.where(np.arange(49_152) == 777, 40.0, -40.0).astype(np.float32)
    inf = (rng.standard_normal(20_000) * 3).astype(np.float32)
    inf[::3] = -np.inf
    rows["-inf"] = inf
    rows["tiny"] = (rng.standard_normal(30_000) * 1e-30).astype(np.float32)
    rows["huge range"] = np.concatenate([rng.uniform(-3e4, 0, 70_000), [1e4]]).astype(np.float32)
    rows["subnormal exps"] = rng.uniform(-104.5, -86.0, 10_007).astype(np.float32)
    rows["negative"] = (rng.standard_normal(262_144) - 500).astype(np.float32)
    return rows


@pytest.mark.parametrize("name", list(adversarial_rows()))
def test_the_fused_raw_sums_are_numpys_bits_on_adversarial_rows(name: str) -> None:
    assert_numpys_bits(adversarial_rows()[name])


@pytest.mark.model
def test_the_fused_raw_sums_are_numpys_bits_on_recorded_rows_of_both_models(request: pytest.FixtureRequest) -> None:
    for row, _ in request.getfixturevalue("smol_rows") + request.getfixturevalue("gemma_rows"):
        assert_numpys_bits(row)
        for t in (0.5, 2.0):  # flatter and sharper rows: the same logits scaled
            assert_numpys_bits((row * np.float32(t)).astype(np.float32))


def test_a_kernel_that_misses_numpys_bits_is_not_used() -> None:
    """The guard: a kernel one ulp off in a sum, or whose exp differs, or without the raw
    pass, or that refuses this CPU, fails the probe."""
    k = built_kernel()
    assert sampler_raw.probe(k)
    off_sum = SimpleNamespace(raw_exp=k.raw_exp, raw_sums=lambda x, m: (np.nextafter(k.raw_sums(x, m)[0], 1e300), 0))
    assert not sampler_raw.probe(off_sum)  # type: ignore[arg-type]

    def off_exp(x: np.ndarray, m: float, out: np.ndarray) -> None:
        k.raw_exp(x, m, out)
        out[len(out) // 2] = np.nextafter(out[len(out) // 2], np.float32(2))

    assert not sampler_raw.probe(SimpleNamespace(raw_exp=off_exp, raw_sums=k.raw_sums))  # type: ignore[arg-type]
    assert not sampler_raw.probe(SimpleNamespace())  # type: ignore[arg-type]

    def refuses(*args: object) -> None:
        raise RuntimeError("raw_exp needs AVX2 and FMA")

    assert not sampler_raw.probe(SimpleNamespace(raw_exp=refuses, raw_sums=refuses))  # type: ignore[arg-type]


def test_the_sampler_takes_the_fused_pass_and_reports_numpys_numbers(monkeypatch) -> None:
    """On the kernel's path sample() calls raw_sums once a step (numpy's exp is not
    called); with RAW_FUSED off it calls numpy's passes; the reports are the same."""
    k = built_kernel()
    monkeypatch.setattr(sampler_fused, "kernel", k)
    monkeypatch.setattr(sampler_raw, "RAW_FUSED", sampler_raw.probe(k))  # (as on import, the kernel on)
    assert sampler_raw.RAW_FUSED
    row = (np.random.default_rng(3).standard_normal(262_144) * 3).astype(np.float32)
    calls: list[int] = []
    real = k.raw_sums
    monkeypatch.setattr(k, "raw_sums", lambda x, m, *copy: calls.append(len(x)) or real(x, m, *copy))
    fused = sampler.sample(row, [1, 2, 3], S(top_k=40), sampler.make_rng(0), 10)
    assert calls == [262_144]
    monkeypatch.setattr(sampler_raw, "RAW_FUSED", False)
    plain = sampler.sample(row, [1, 2, 3], S(top_k=40), sampler.make_rng(0), 10)
    assert calls == [262_144]
    assert bits(fused.raw_entropy) == bits(plain.raw_entropy) and bits(fused.raw_prob) == bits(plain.raw_prob)
    assert np.array_equal(fused.raw_top_probs, plain.raw_top_probs)
    assert fused.token_id == plain.token_id


@pytest.mark.parametrize("name", list(adversarial_rows()))
def test_one_tokens_raw_probability_is_the_tops_figure(name: str) -> None:
    """RawSoftmax.prob_of (the drawn token's raw probability: the kernel's raw_prob, no arrays made) gives
    probs_at's figure for that token (raw_probs: numpy's float32 exp, widened, over the total) bit for bit,
    at every position of a row made to break it; a row the kernel does not take falls back to it."""
    built_kernel()
    row = adversarial_rows()[name]
    raw = sampler_raw.raw_softmax(row, float(row.max()))
    assert raw.e is None and sampler_raw._RAW_PROB is not None  # (the fused pass, and its one-token call)
    ids = np.arange(row.shape[0], dtype=np.int64)
    want = raw.probs_at(ids)
    got = np.array([raw.prob_of(int(i)) for i in ids])
    assert got.tobytes() == want.tobytes() or np.array_equal(got, want, equal_nan=True), name
    strided = sampler_raw.RawSoftmax(raw.total, raw.dot, np.repeat(row, 2)[::2], raw.shift, None)
    assert strided.prob_of(0) == raw.prob_of(0) or np.isnan(raw.prob_of(0))
