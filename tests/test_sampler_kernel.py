"""The sampler's C kernel (src/loopchat/engine/_sampler_kernel.c, through sampler_fused):
its exp within 2 ulp of numpy's, each fused pass equal to the numpy passes it replaces (to
the last bits of a sum), and the whole chain on both paths equal to the reference sampler
on arrays made to break it: ties, a flat row, a one-hot row, -inf logits, fewer tokens than
a block, a length that is not a multiple of the vector width. (On recorded rows of both
models: tests/test_sampler_chain.py, on both paths too.)"""

from __future__ import annotations

import hashlib
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import test_sampler_chain as chain
from sampler_paths import built_kernel, sampler_path  # noqa: F401 (a fixture)

from loopchat.engine import sampler, sampler_fused


def test_the_kernel_is_built_where_there_is_a_compiler() -> None:
    """`optional=True` in setup.py: a failed build still installs. Here it must not fail."""
    if shutil.which(sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc") is None:
        pytest.skip("no C compiler: the numpy path runs")
    assert built_kernel().__name__.endswith("_sampler_kernel")


def test_the_kernel_in_use_is_built_from_the_source_beside_it() -> None:
    """A build that fails is as silent as `optional=True` makes a missing compiler, and `pip
    install -e` leaves the older module in place: the tests would then run an older kernel. The
    build records the C file's sha256 (setup.py); the module in use must carry this file's."""
    k = built_kernel()
    source = Path(sampler_fused.__file__).with_name("_sampler_kernel.c")
    want = hashlib.sha256(source.read_bytes()).hexdigest()
    assert getattr(k, "source_sha256", None) == want, (
        f"the C kernel in use ({k.__file__}) was not built from {source}: its build failed or did not run. "
        "Rebuild it (.venv/bin/pip install -v -e . --no-deps) and read the compiler's errors"
    )


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.abs(got - want) / np.spacing(want)


def test_the_kernels_exp_is_within_2_ulp_of_numpys() -> None:
    k = built_kernel()
    rng = np.random.default_rng(1)
    x = np.concatenate(
        [
            -rng.random(400_000) * 708.0,  # every normal result
            -rng.random(100_000) * 30.0,  # a logit's usual range below the max
            -rng.random(100_000) * 1e-6,
            np.array([0.0, -0.0, -1e-300, -5e-324, -0.5 * np.log(2), -np.log(2), -708.39]),
            -np.arange(0, 700, 0.693147180559945),  # the reduction's boundaries
        ]
    )
    out = np.empty_like(x)
    k.exp(x, out)
    want = np.exp(x)
    assert ulps(out, want).max() <= 2.0
    # below exp's normal range: subnormal results, then 0 (numpy's too), and the specials
    tiny = np.array([-708.5, -720.0, -744.0, -745.1, -746.0, -800.0, -1e300, -np.inf])
    out = np.empty_like(tiny)
    k.exp(tiny, out)
    assert np.all(np.abs(out - np.exp(tiny)) <= 2 * 5e-324 + 2 * np.spacing(np.exp(tiny)))
    assert out[-1] == 0.0 and out[-2] == 0.0
    special = np.array([np.nan])
    k.exp(special, special)
    assert np.isnan(special[0])


def rows() -> dict[str, np.ndarray]:
    """Arrays made to break the passes (float32, as logits come)."""
    rng = np.random.default_rng(2)
    n = 49_157  # not a multiple of 4, 8 or the draw's block
    spread = (rng.standard_normal(n) * 4).astype(np.float32)
    ties = np.round(rng.standard_normal(n) * 3).astype(np.float32)  # many equal logits
    ties[[5, 900, 40_000]] = ties.max()  # equal top logits
    one_hot = np.full(n, -20.0, dtype=np.float32)
    one_hot[1234] = 10.0
    with_inf = spread.copy()
    with_inf[::7] = -np.inf  # banned tokens
    return {
        "spread": spread,
        "ties": ties,
        "flat": np.zeros(n, dtype=np.float32),
        "one-hot": one_hot,
        "-inf": with_inf,
        "short": spread[:1001],  # fewer than a block
        "odd": spread[:3],
        "one": spread[:1],
    }


ROWS = rows()


def both(fn, *args):  # type: ignore[no-untyped-def]
    """fn's result on the kernel's path and on numpy's."""
    saved = sampler_fused.kernel
    try:
        sampler_fused.kernel = built_kernel()
        got = fn(*args)
        sampler_fused.kernel = None
        return got, fn(*args)
    finally:
        sampler_fused.kernel = saved


def close(a: float, b: float) -> bool:
    """Sums in another order: a few ulp per term at worst, far inside the chain's 1e-9."""
    return abs(a - b) <= 1e-11 * max(abs(a), abs(b), 1e-300)


@pytest.mark.parametrize("name", list(ROWS))
def test_each_fused_pass_gives_what_the_numpy_passes_give(name: str) -> None:
    x = ROWS[name]
    mx = float(x.max())
    n = x.shape[0]

    def exp_sum() -> tuple[float, np.ndarray]:
        q = np.empty(n)
        return sampler_fused.exp_sum(x, mx, q), q

    (k_total, k_q), (n_total, n_q) = both(exp_sum)
    assert close(k_total, n_total)
    assert np.all(ulps(k_q, n_q)[n_q > 0] <= 2.0) and np.array_equal(k_q == 0, n_q == 0)

    for t in (1.0, 0.7, 2.0):
        for src, shift in ((x, mx), (x.astype(np.float64) - mx, 0.0)):

            def dist(src: np.ndarray = src, shift: float = shift, t: float = t) -> tuple:
                w, blocks, norm, wz = sampler_fused.distribution(src, shift, t, sampler.DRAW_BLOCK)
                return w.copy(), blocks.copy(), norm, wz

            (kw, kb, kn, kwz), (nw, nb, nn, nwz) = both(dist)
            assert np.array_equal(kw == 0, nw == 0)
            if t == 1.0:
                assert np.all(ulps(kw, nw)[nw > 0] <= 2.0)
            else:  # times 1 / t: z within 1.5 ulp of z / t, w within |z| * 3.3e-16 (|z| < 300 here)
                pos = nw > 0
                assert np.all(np.abs(kw[pos] / nw[pos] - 1) <= 1e-13)
            assert kb.shape == nb.shape and np.allclose(kb, nb, rtol=1e-11, atol=0)
            assert close(kn, nn)
            # (-inf logits: 0 * -inf is NaN on both paths, as in the reference)
            assert (np.isnan(kwz) and np.isnan(nwz)) or abs(kwz - nwz) <= 1e-11 * max(abs(nwz), nn)

    for min_p in (1.0, 0.05, 1e-9):

        def keep(min_p: float = min_p) -> tuple:
            ids, z, mass, _ = sampler_fused.min_p_keep(x, mx + np.log(min_p), mx)
            return ids.copy(), z.copy(), mass

        (ki, kz, km), (ni, nz, nm) = both(keep)
        assert ki.dtype == ni.dtype and np.array_equal(ki, ni) and np.array_equal(kz, nz) and close(km, nm)
        # the cut token's position from the same pass: cut_below's own pass at the least float32 >= the floor
        for floor in (mx + np.log(min_p), float(np.nextafter(np.float32(mx + np.log(min_p)), np.float32(-np.inf)))):
            at, again = built_kernel().min_p(x, floor, mx, np.empty(n, np.int64), np.empty(n), True)[2:]
            v = np.float32(floor)
            v = np.nextafter(v, np.float32(np.inf)) if float(v) < floor else v
            assert at == built_kernel().cut_below(x, float(v))[0], (min_p, floor)
            same = np.flatnonzero(x == x[at]) if at >= 0 else np.array([-1, -1])
            assert again == (same[1] if same.shape[0] > 1 else -1), (min_p, floor)
            assert built_kernel().min_p(x, floor, mx, np.empty(n, np.int64), np.empty(n))[3] == -2

    for threshold in {x.max(), x[0], x.min(), np.float32(np.inf), np.float32(-np.inf)}:
        got, want = both(sampler_fused.at_least, x, np.float32(threshold))
        assert got.dtype == want.dtype and np.array_equal(got, want), threshold

    lo = float(x.min())
    if np.isfinite(lo) and mx > lo:  # top-p's bins (which refuse -inf, as before): the same bins, the same sums
        q = np.exp(x.astype(np.float64) - mx)
        scale = np.float32(2048 / (mx - lo))
        (k_idx, k_hist), (n_idx, n_hist) = both(
            lambda: [a.copy() for a in sampler_fused.bin_masses(x, np.float32(lo), scale, 2048, q)]
        )
        assert np.array_equal(k_idx, n_idx) and np.array_equal(k_hist, n_hist)
        for b in {0, int(n_idx[0]), int(n_idx.max()), 2047}:
            got = sampler_fused.bin_split(k_idx, b)  # the kernel's int32 bins
            want = sampler_fused.bin_split(n_idx, b)  # numpy's
            assert all(np.array_equal(g, w) and g.dtype == w.dtype for g, w in zip(got, want, strict=True))

    for i in {0, n // 2, n - 1, int(np.argmax(x)), int(np.argmin(x))}:
        for arr in (x, x.astype(np.float64)):
            got, want = both(sampler_fused.count_greater, arr, i)
            assert got == want == int(np.count_nonzero(arr > arr[i]))


SETTINGS = [
    chain.S(),  # every token kept
    chain.S(temperature=0.7),
    chain.S(top_p=0.95),
    chain.S(top_p=0.999, temperature=2.0),
    chain.S(min_p=0.05, temperature=0.7),
    chain.S(top_p=0.95, min_p=0.05, temperature=0.7, repeat_penalty=1.1),
    chain.S(min_p=1e-4, temperature=1.7, repeat_penalty=1.3),
    chain.S(min_p=1.0, temperature=0.0),
]  # (no DRY: the reference predates it)


# (not "-inf": the raw entropy is NaN there and top-p's bins refuse it, in the reference as
# in the chain; llama.cpp's logits are finite. The passes above do take -inf.)
@pytest.mark.parametrize("name", [n for n in ROWS if n not in ("odd", "one", "-inf")])
@pytest.mark.usefixtures("sampler_path")
def test_the_chain_on_both_paths_gives_what_the_reference_gives_on_adversarial_rows(name: str) -> None:
    rows = [(ROWS[name], [5, 900, 1234, 7, 7, 3, 5, 900])]
    for settings in SETTINGS:
        for report_k in (1, 10, 40):
            chain.compare(rows, settings, report_k, seeds=(0, 1, 2, 3))
