"""The sorted form's tail of the chain in Python floats (engine/sampler_tail.py) and the raw top
found in top-k's own pass (sampler._wide_top): the same numbers as the stages', bit for bit,
with fewer calls into numpy a step (the real default model's logits), on any CPU: the tail's
exps and log2s are numpy's, whichever code numpy runs for them here."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from sampler_paths import built_kernel

from loopchat.engine import sampler, sampler_tail
from loopchat.engine.engine import Engine
from loopchat.events import Message
from loopchat.settings import SamplingSettings

#: the settings `loopchat serve` is measured at against llama-server (benchmarks/serve_vs_llama_server.py)
SERVED = dataclasses.replace(
    SamplingSettings(), temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, dry_multiplier=0.0
)


def test_np_sum_adds_in_numpys_order() -> None:
    """np_sum is float(np.array(a).sum()) bit for bit, at every length around numpy's leaves."""
    rng = np.random.default_rng(11)
    for n in [*range(0, 300), 511, 512, 513, 1000, 1024, 1031]:
        for scale in (1.0, 1e-300):
            a = rng.random(n) * np.exp(-rng.random(n) * 40) * scale
            assert sampler_tail.np_sum(a.tolist()) == float(a.sum()), n


@pytest.fixture(scope="module")
def rows(engine: Engine) -> list[np.ndarray]:
    """24 rows of the model's logits along a reply drawn at the served settings."""
    engine.reset()
    tokens = list(engine.fit_prompt([Message("user", "Tell me a story about a harbour at night.")], 24).tokens)
    engine.evaluate(tokens)
    engine.sync()
    rng, out = sampler.make_rng(3), []
    for _ in range(24):
        row = engine.logits().copy()
        out.append(row)
        engine.forward(sampler.sample(row, [], SERVED, rng, 5).token_id)
    engine.reset()
    return out


def _fields(res: sampler.SampleResult) -> tuple:
    return tuple(
        getattr(res, n).tobytes() if isinstance(getattr(res, n), np.ndarray) else getattr(res, n)
        for n in res.__slots__  # type: ignore[attr-defined]
        if n != "basis"
    )


GRID = [
    SERVED,
    *(
        dataclasses.replace(SERVED, temperature=t, top_k=k, top_p=p, min_p=m)
        for t, k, p, m in [(1.0, 40, 1.0, 0.0), (1.3, 100, 0.9, 0.0), (0.7, 40, 1.0, 0.3), (0.2, 5, 0.5, 0.1)]
        + [(1.0, 2, 0.01, 0.0), (0.7, 1, 0.95, 0.05), (2.0, 250, 0.999, 0.0), (0.7, 300, 0.95, 0.05)]
    ),
    dataclasses.replace(SERVED, repeat_penalty=1.1, repeat_last_n=64),
]
#: top-k off (or above 1,024): top-p runs over the unsorted candidates as a stage and sorts the few it
#: keeps; min-p, temperature and the draw then run in the tail (draw_sorted's two stages)
UNSORTED = [
    dataclasses.replace(SERVED, temperature=t, top_k=k, top_p=p, min_p=m, dry_multiplier=dry, repeat_penalty=rp)
    for t, k, p, m, dry, rp in [
        (2.0, 0, 0.95, 0.0, 0.8, 1.0), (0.7, 0, 0.95, 0.05, 0.8, 1.1), (1.0, 0, 0.5, 0.0, 0.0, 1.0),
        (1.3, 2000, 0.9, 0.2, 0.0, 1.0), (0.7, 0, 0.999, 0.05, 0.0, 1.0), (1.0, 0, 0.95, 0.0, 0.0, 1.0),
    ]
]  # fmt: skip


@pytest.mark.model
def test_the_tail_runs_on_every_sorted_step_whatever_numpys_exp(rows, monkeypatch) -> None:
    """The tail takes its exps and log2s from numpy, so it runs on a CPU where numpy's float64 exp
    is the C library's and on one where it is numpy's own (AVX-512) alike: at settings whose chain
    ends sorted in top-p, min-p and temperature it never declines (the old tail, math's exp, had to
    decline on every step of an AVX-512 CPU)."""
    taken, draw_sorted = [0, 0], sampler_tail.draw_sorted

    def counted(*args):  # type: ignore[no-untyped-def]
        got = draw_sorted(*args)
        taken[got is not None] += 1
        return got

    monkeypatch.setattr(sampler_tail, "draw_sorted", counted)
    rng = sampler.make_rng(7)
    for settings in GRID:
        for r in rows:
            sampler.sample(r, [], settings, rng, 5)
    assert taken == [0, len(rows) * len(GRID)]


after_top_p = [0]


def counted_after(c, tail, rng):  # type: ignore[no-untyped-def]
    """draw_sorted, counting the draws it made of two stages (after top-p over the unsorted form)."""
    got = _draw_sorted(c, tail, rng)
    after_top_p[0] += got is not None and len(tail) == 2
    return got


_draw_sorted = sampler_tail.draw_sorted


@pytest.mark.model
def test_the_tail_and_the_shared_top_give_the_stages_numbers_bit_for_bit(rows, monkeypatch) -> None:
    """Every field of every step (the stages' reports, both top lists, the entropies, the ranks)
    and the generator's next draw the same with the tail and the shared top as without them; also
    where top-k is off and the tail's last two stages follow top-p over the unsorted candidates."""
    taken = [0]
    draw_sorted = sampler_tail.draw_sorted

    def counted(*args):  # type: ignore[no-untyped-def]
        got = draw_sorted(*args)
        taken[0] += got is not None
        return got

    history = list(range(200, 260))
    for settings in GRID + UNSORTED:
        for report_k in (1, 5, 20, 40):
            runs = []
            for fast in (True, False):
                with monkeypatch.context() as m:
                    m.setattr(sampler_tail, "draw_sorted", counted)
                    if not fast:  # the stages' own path, the raw top searched alone
                        m.setattr(sampler_tail, "draw_sorted", lambda *a: None)
                        m.setattr(sampler, "_wide_top", lambda *a: None)
                    rng = sampler.make_rng(7)
                    runs.append(
                        ([_fields(sampler.sample(r, history, settings, rng, report_k)) for r in rows], rng.random())
                    )
            assert runs[0] == runs[1], (settings, report_k)
    assert taken[0] >= len(rows) * 20  # (the tail ran: not a comparison of the old path with itself)
    after_top_p[0] = 0
    for settings in UNSORTED:
        rng = sampler.make_rng(7)
        for r in rows:
            with monkeypatch.context() as m:
                m.setattr(sampler_tail, "draw_sorted", counted_after)
                sampler.sample(r, history, settings, rng, 5)
    assert after_top_p[0] >= len(rows) * 4  # (and after an unsorted top-p: its two stages)


@contextmanager
def numpy_calls() -> Iterator[list[int]]:
    """Calls into numpy made from outside it inside a block: its Python functions, and its C
    functions and methods called by name (its operators, a - b, are not calls: not counted)."""
    count, home = [0], np.__file__.rsplit("/", 1)[0]

    def inside(frame) -> bool:  # type: ignore[no-untyped-def]
        return frame is not None and frame.f_code.co_filename.startswith(home)

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call":  # (a Python function of numpy's, called from outside it)
            count[0] += inside(frame) and not inside(frame.f_back)
        elif event == "c_call" and not inside(frame):
            count[0] += isinstance(arg, np.ufunc) or isinstance(
                getattr(arg, "__self__", None), (np.ndarray, np.random.Generator)
            )

    sys.setprofile(profile)
    try:
        yield count
    finally:
        sys.setprofile(None)


#: calls into numpy a step at the served settings (top_logprobs 5): 34 (median) when the raw top
#: and the max had passes of their own and top-p, min-p, temperature and the draw ran numpy on
#: ~40 floats; 6 with the tail's exps and log2s math's (only where they were numpy's bits); 9
#: with them numpy's own, one call each and their lists (every CPU)
NUMPY_CALLS_PER_STEP = 12


@pytest.mark.model
def test_a_served_step_makes_few_numpy_calls(rows) -> None:
    rng, counts = sampler.make_rng(1), []
    for row in rows:
        with numpy_calls() as n:
            sampler.sample(row, [], SERVED, rng, 5)
        counts.append(n[0])
    median = sorted(counts)[len(counts) // 2]
    assert median <= NUMPY_CALLS_PER_STEP, f"{median} calls into numpy a step ({counts})"


def test_the_kernels_tail_figures_are_the_python_floats_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """tail_norm and tail_draw give _figures_floats' distribution, entropy, pick and rank, bit for bit,
    on weights of every kind (tiny, zero, tied, one dominant) and lengths around numpy's pairwise
    leaves, the generator left in the same state; the draws land on many positions."""
    kernel = built_kernel()
    monkeypatch.setattr(sampler_tail, "_TAIL", (kernel.tail_norm, kernel.tail_draw))
    gen = np.random.default_rng(5)
    picks = set()
    for n in [*range(2, 140), 255, 256, 300, 1024]:
        for kind in ("spread", "zeros", "ties", "sharp"):
            w = np.exp(-gen.random(n) * 30)
            if kind == "zeros":
                w[gen.random(n) < 0.4] = 0.0
            elif kind == "ties":
                w = np.round(w * 4) / 4
            elif kind == "sharp":
                w *= 1e-12
            w[0] = 1.0
            w = -np.sort(-w)
            runs = []
            for fig in (sampler_tail._figures_floats, sampler_tail._figures_kernel):
                rng = sampler.make_rng(n)
                probs, entropy, pick, rank = fig(w.copy(), rng)
                runs.append((np.asarray(probs, dtype=np.float64).tobytes(), entropy, pick, rank, rng.random()))
            assert runs[0] == runs[1], (n, kind)
            picks.add((n, runs[1][2]))
    assert len({p for n, p in picks if n > 8 and p > 0}) > 10  # (not only the first drawn)
