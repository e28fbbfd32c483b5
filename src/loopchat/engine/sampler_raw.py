"""The raw softmax over the whole vocabulary, in float32: the numbers `sampler.sample` reports
first (the raw probabilities of the top tokens and of the one drawn, the raw entropy).

They are numpy's float32 passes, as tests/reference_sampler.py computes them:
    s = logits - float32(max); e = np.exp(s); total = e.sum(); dot = np.einsum("i,i->", e, s)
The C kernel's `raw_sums` (_sampler_kernel.c) does them in one pass and stores nothing, with
numpy 2.4's own arithmetic (its AVX2+FMA float32 exp, the pairwise sum of np.add.reduce,
einsum's lanes and buffers), so the same bits; `raw_exp` gives the few e[i] reported. That
holds only for the numpy and the CPU it was written against, so on first import the kernel
is checked against numpy on a probe set (a sweep of the exp's arguments, special values,
sums of many lengths) and used only if every bit matches: `RAW_FUSED` says whether it is.
Otherwise (or with sampler_fused's kernel off) numpy's passes run, into scratch memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from loopchat.engine import sampler_fused
from loopchat.engine.sampler_scratch import scratch

#: the exp's probe: float32 arguments from 0 down to -104.5 (below numpy's -103.97 cutoff),
#: every _SWEEP_STEP-th float32 there, plus the values where its branches change
_SWEEP_STEP = 4099
_SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, -1e-45, -1e-38, -1e-7, -87.33654, -87.3, -88.0, -103.97208]
_SPECIAL += [-103.972084, -103.97209, -104.0, 1e-45, 88.0, 88.72283935546875, 89.0, -3.4e38]
#: the sums' probe: these lengths (the leaves and halves of the pairwise sum, einsum's groups
#: of 16 and its buffers of 8192, both models' vocabularies), random rows
_LENGTHS = [*range(1, 301), 1000, 8191, 8192, 8193, 16400, 49152, 151936, 262144]


def _rows(rng: np.random.Generator) -> list[np.ndarray]:
    rows = [(rng.standard_normal(n) * (0.5 + 10 * rng.random())).astype(np.float32) for n in _LENGTHS]
    tied = np.full(300, 2.5, dtype=np.float32)
    tied[::7] = -np.inf
    rows += [tied, np.full(257, -50.0, dtype=np.float32), np.linspace(-200, 0, 999, dtype=np.float32)]
    return rows


def _numpy_pass(logits: np.ndarray, m: float, keep: bool = True) -> tuple[float, float, np.ndarray]:
    """numpy's float32 passes (the reference's): the sum of e = exp(logits - m), the sum of
    e * (logits - m), and e (scratch memory; `keep` False: fresh arrays, as the import's
    probe wants, on a thread that may never sample)."""
    n = logits.shape[0]
    shifted = np.subtract(logits, np.float32(m), out=scratch.get("shifted", n, np.float32) if keep else None)
    e = np.exp(shifted, out=scratch.get("exp", n, np.float32) if keep else None)
    # (einsum, not np.dot: a BLAS call, whose threads would spin against llama.cpp's)
    return float(e.sum()), float(np.einsum("i,i->", e, shifted)), e


def _same(a: float, b: float) -> bool:
    return np.float64(a).tobytes() == np.float64(b).tobytes()


def probe(k: ModuleType) -> bool:
    """Whether k's raw_exp and raw_sums give numpy's bits on the probe set."""
    try:
        lo = int(np.array([-104.5], dtype=np.float32).view(np.uint32)[0])
        x = np.arange(0x80000000, lo + 1, _SWEEP_STEP, dtype=np.uint32).view(np.float32)
        x = np.concatenate([x, np.array(_SPECIAL, dtype=np.float32)])
        got = np.empty_like(x)
        k.raw_exp(x, 0.0, got)
        with np.errstate(all="ignore"):
            if not np.array_equal(got.view(np.uint32), np.exp(x).view(np.uint32)):
                return False
            for row in _rows(np.random.default_rng(23)):
                m = float(row.max())
                total, dot = k.raw_sums(row, m)
                want_total, want_dot, _ = _numpy_pass(row, m, keep=False)
                if not (_same(total, want_total) and _same(dot, want_dot)):
                    return False
    except (AttributeError, RuntimeError, TypeError):  # an older kernel, a CPU without AVX2+FMA
        return False
    return True


_KERNEL = sampler_fused.kernel
#: whether the kernel's fused raw pass gives numpy's bits here (and so is used)
RAW_FUSED = _KERNEL is not None and probe(_KERNEL)


#: numpy's float32 exp against the float64 exp, over every float32 of [-104.5, 0] (once, by
#: hand): at most 3.57 * 2^-24 relative where the result is normal, 2.2e-45 absolute where it
#: is subnormal or 0. RawSoftmax.bound takes more than twice those.
_EXP32_REL = 8.0 * 2.0**-24
_EXP32_ABS = 1e-44


@dataclass(slots=True)
class RawSoftmax:
    """total: the sum of e = exp(logits - max) (float32, then float); dot: sum(e * (logits -
    max)) (the same); exp_at(ids): e at those positions (float32: the fused pass recomputes
    them, numpy's kept them); sum64: the same e's summed in float64 (see bound); copied: the
    array the fused pass copied the logits into (raw_softmax's `copy`; None: none)."""

    total: float
    dot: float
    logits: np.ndarray
    shift: float
    e: np.ndarray | None
    sum64: float = math.nan
    copied: np.ndarray | None = None  # (the array the pass copied the logits into, if any)

    def bound(self) -> tuple[float, float] | None:
        """(X, E): the exact sum of exp(float64(logits) - shift) is within E of X (sum64). Each
        e is exp(s)(1 + a) with s the float32 logit - shift, |a| <= _EXP32_REL (or off by at most
        _EXP32_ABS), and s within 2^-24 |s| of the exact difference d, so exp(s) within
        exp(d) 2^-24 |d| (1 + 1e-5) of exp(d): summed, 2^-24 |dot| (the float32 dot within 1%
        of sum(e |s|)) and _EXP32_REL X; the float64 sum's own rounding within 1e-10 X. None:
        no bound (a non-finite sum: -inf logits make dot NaN)."""
        if not (math.isfinite(self.sum64) and math.isfinite(self.dot)):
            return None
        n = self.logits.shape[0]
        err = 1.02 * 2.0**-24 * abs(self.dot) + (1.001 * _EXP32_REL + 1e-10) * self.sum64 + n * _EXP32_ABS
        return self.sum64, err

    def exp_at(self, ids: np.ndarray) -> np.ndarray:
        if self.e is not None:
            return self.e[ids]
        out = np.empty(ids.shape[0], dtype=np.float32)
        sampler_fused.kernel.raw_exp(np.ascontiguousarray(self.logits[ids]), self.shift, out)  # type: ignore[union-attr]
        return out

    def prob_of(self, token: int) -> float:
        """One token's raw probability: float(exp_at([token])[0]) / total, by probs_at (its one kernel call;
        the kernel's raw_prob where the fused pass ran: the same figure, no arrays made)."""
        if self.e is None and _RAW_PROB is not None:
            try:
                return float(_RAW_PROB(self.logits, token, self.shift, self.total))
            except (TypeError, ValueError):  # (logits the kernel does not take: not contiguous float32)
                pass
        return float(self.probs_at(np.array([token], dtype=np.int64))[0])

    def probs_at(self, ids: np.ndarray) -> np.ndarray:
        """The raw probabilities at these ids: exp_at(ids), widened to float64, over `total` (the
        fused pass's: one kernel call, the same bits, where the logits and ids are the kernel's)."""
        kernel = sampler_fused.kernel
        if self.e is None and kernel is not None and ids.dtype == np.int64 and self.logits.flags.c_contiguous:
            out = np.empty(ids.shape[0], dtype=np.float64)
            kernel.raw_probs(self.logits, ids, self.shift, self.total, out)
            return out
        return self.exp_at(ids).astype(np.float64) / self.total


def raw_softmax(logits: np.ndarray, raw_max: float, sum64: bool = False, copy: np.ndarray | None = None) -> RawSoftmax:
    """The raw softmax's sums over float32 logits whose max is raw_max: one fused pass where
    RAW_FUSED (and the kernel is on), numpy's passes otherwise; the same bits. `sum64`: the
    e's float64 sum too (RawSoftmax.bound: the kernel's raw_sums64, the same pass). `copy` (float32,
    the logits' length): the fused pass also copies the logits into it as it reads them (the
    penalties' copy, sampler_penalized, made here instead of by a second pass: ~0.1 ms on Gemma's
    262,144 tokens); `RawSoftmax.copied` says whether it did (numpy's passes do not)."""
    fusable = logits.dtype == np.float32 and logits.flags.c_contiguous and math.isfinite(raw_max)
    if RAW_FUSED and sampler_fused.kernel is not None and fusable:  # (an infinite max: numpy's warnings)
        if copy is not None and not _COPIES:
            copy = None
        if sum64 and _SUMS64:
            total, dot, s64 = sampler_fused.kernel.raw_sums64(logits, raw_max, copy)
            return RawSoftmax(total, dot, logits, raw_max, None, s64, copy)
        total, dot = sampler_fused.kernel.raw_sums(logits, raw_max, copy)
        return RawSoftmax(total, dot, logits, raw_max, None, copied=copy)
    total, dot, e = _numpy_pass(logits, raw_max)
    return RawSoftmax(total, dot, logits, raw_max, e, float(e.sum(dtype=np.float64)) if sum64 else math.nan)


#: the kernel's raw_prob, where its raw pass is in use (None: a kernel built before it, or numpy's passes)
_RAW_PROB = getattr(_KERNEL, "raw_prob", None) if RAW_FUSED else None

#: whether the kernel has raw_sums64 (a kernel built before it: no float64 sum, no bound)
_SUMS64 = hasattr(_KERNEL, "raw_sums64")


def _copies(k: ModuleType | None) -> bool:
    """Whether k's raw pass takes `copy` (a kernel built before it: the penalties copy by themselves)."""
    if k is None or not RAW_FUSED:
        return False
    x, out = np.arange(40, dtype=np.float32), np.zeros(40, dtype=np.float32)
    try:
        k.raw_sums(x, 39.0, out)
    except TypeError:
        return False
    return bool(np.array_equal(out, x))


_COPIES = _copies(_KERNEL)


def total_bounds(bound: tuple[float, float], shift: float, mx: float) -> tuple[float, float]:
    """Where the sum of exp(float64(x) - mx) lies, as a float64 pass computes it (each exp
    within 2 ulp, the sum's rounding within 1e-10 of it), from a `bound` (X, E) on the exact
    sum of exp(float64(x) - shift) (RawSoftmax.bound, moved by the penalties)."""
    x, err = bound
    f = math.exp(shift - mx)
    return (x - err) * f * (1.0 - 1e-9), (x + err) * f * (1.0 + 1e-9)
