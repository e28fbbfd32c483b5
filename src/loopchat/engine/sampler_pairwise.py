"""numpy's pairwise sum of float64 values, in Python floats (`np_sum`): the sampler's short sums
(sampler_tail's, Candidates.mass_of's) without a call into numpy's reduction, the same bits."""

from __future__ import annotations

__all__ = ["np_sum"]

_BLOCK = 128  # numpy's PW_BLOCKSIZE: a pairwise sum's leaf


def np_sum(a: list[float]) -> float:
    """float(np.array(a).sum()) for float64 values: numpy's pairwise sum, its additions in its
    order (eight partial sums over a leaf of at most 128, halves split at a multiple of 8)."""
    n = len(a)
    if n < 8:
        res = 0.0
        for v in a:
            res += v
        return res
    if n <= _BLOCK:
        r = a[:8]
        end = n - n % 8
        for i in range(8, end, 8):
            r[0] += a[i]
            r[1] += a[i + 1]
            r[2] += a[i + 2]
            r[3] += a[i + 3]
            r[4] += a[i + 4]
            r[5] += a[i + 5]
            r[6] += a[i + 6]
            r[7] += a[i + 7]
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for i in range(end, n):
            res += a[i]
        return res
    half = n // 2
    half -= half % 8
    return np_sum(a[:half]) + np_sum(a[half:])
