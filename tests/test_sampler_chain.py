"""The sampler as a chain of stages gives exactly what the sampler gave before it was one.

tests/reference_sampler.py is the sampler as it was (src/loopchat/sampler.py at 84b3239,
byte for byte). Both run on real logits of both test models (the default model and
Gemma 3 270M, a 262,144-token vocabulary: the paths that never sort the whole
vocabulary), over a grid of settings (each stage on and off, temperature 0, extreme
values, the forced token) and several seeds, each seed's generator carried from step to
step: every field of SampleResult must be the same, the token ids exactly, the floats
within 1e-9. Each comparison runs on both of the sampler's paths (tests/sampler_paths.py:
the C kernel and numpy), so neither rots.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from sampler_paths import sampler_path  # noqa: F401 (a fixture)

from loopchat.engine import sampler
from loopchat.engine.engine import Engine
from loopchat.events import Message
from loopchat.settings import SamplingSettings

pytestmark = pytest.mark.model

PROMPT = [Message("user", "Write a story about a lighthouse keeper and a storm at sea.")]
STEPS = 24
SEEDS = (0, 1, 2)


def load_reference() -> ModuleType:
    """tests/reference_sampler.py, loaded as a module of the loopchat package (its imports
    are relative, as they were in src/)."""
    name = "loopchat.reference_sampler"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("reference_sampler.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


reference = load_reference()


class Rows(list[tuple[np.ndarray, list[int]]]):
    """Recorded rows, and what the old sampler gave on them (filled by `compare` and
    `compare_forced`). The reference does not depend on the sampler's path (it imports
    nothing of sampler_fused): each test runs on both paths, and the second reads the
    first's reference results instead of computing them again."""

    def __init__(self, rows: list[tuple[np.ndarray, list[int]]]) -> None:
        super().__init__(rows)
        self.reference: dict[tuple[object, ...], Any] = {}


def old_results(
    rows: list[tuple[np.ndarray, list[int]]], settings: SamplingSettings, report_k: int, seed: int
) -> tuple[list[Any], float]:
    """The old sampler over the rows with one seed's generator carried from step to step,
    and that generator's next draw (kept on `Rows`; a slice of them is a plain list)."""
    cache = getattr(rows, "reference", None)
    key = ("run", settings, report_k, seed)
    if cache is not None and key in cache:
        return cache[key]
    rng = reference.make_rng(seed)
    got = ([reference.sample(logits, history, settings, rng, report_k) for logits, history in rows], rng.random())
    if cache is not None:
        cache[key] = got
    return got


def record(engine: Engine, steps: int = STEPS) -> Rows:
    """Real rows of logits and the context before each: a reply drawn at the defaults."""
    engine.reset()
    history = list(engine.fit_prompt(PROMPT, steps).tokens)
    engine._eval(history)
    rng = sampler.make_rng(5)
    rows = []
    for _ in range(steps):
        row = engine._logits().copy()
        rows.append((row, list(history)))
        token = reference.sample(row, history, SamplingSettings(), rng).token_id
        history.append(token)
        engine._decode_one(token)
        engine._sync()
    engine.reset()
    return Rows(rows)


@pytest.fixture(scope="module")
def smol_rows(engine: Engine) -> list[tuple[np.ndarray, list[int]]]:
    return record(engine)


@pytest.fixture(scope="module")
def gemma_rows(gemma_engine: Engine) -> list[tuple[np.ndarray, list[int]]]:
    return record(gemma_engine, 12)


def S(**kw: float) -> SamplingSettings:
    return SamplingSettings(**{"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0, **kw})


#: each of the five stages on or off (on: the defaults' values), at two temperatures
ON_OFF = [
    S(temperature=t, repeat_penalty=rp, top_k=k, top_p=p, min_p=m)
    for rp, k, p, m, t in itertools.product((1.0, 1.1), (0, 40), (1.0, 0.95), (0.0, 0.05), (0.7, 1.0))
]
#: temperature 0, extreme values, the sizes around the sorted path's limit
EXTREMES = [
    S(temperature=0.0),
    S(temperature=0.0, repeat_penalty=1.5, top_k=40, top_p=0.5, min_p=0.3),
    S(temperature=5.0),
    S(temperature=0.05, top_k=40),
    S(temperature=2.0, top_p=0.999),
    S(top_k=1),
    S(top_k=1, temperature=3.0),
    S(top_k=2, top_p=0.01),
    S(top_p=0.01),
    S(min_p=1.0),
    S(min_p=1e-4, temperature=1.7),
    S(top_p=0.9999, min_p=1e-3),
    S(top_k=1024),
    S(top_k=1025),
    S(top_k=3000, top_p=0.99),
    S(top_k=3000, min_p=0.01),
    S(top_k=1_000_000, top_p=0.97),
    S(repeat_penalty=0.5, repeat_last_n=8),
    S(repeat_penalty=5.0, repeat_last_n=100_000, top_p=0.9),
    S(repeat_penalty=1.3, repeat_last_n=0, top_k=10),
]
GRID = ON_OFF + EXTREMES


def _within(a: np.ndarray, b: np.ndarray, atol: float) -> bool:
    """np.allclose(a, b, rtol=0, atol=atol) on arrays of one shape, without its Python
    overhead (the comparisons run ~40,000 times a run on arrays of 1-40 entries): equal
    entries (the infinities too) or finite ones within atol; a NaN is never close."""
    with np.errstate(invalid="ignore"):
        return bool(np.all((a == b) | (np.abs(a - b) <= atol)))


def same(old: object, new: object) -> None:
    """Every field of the old SampleResult equal in the new: ids exactly, floats to 1e-9."""
    for name in old.__slots__:  # type: ignore[attr-defined]
        a, b = getattr(old, name), getattr(new, name)
        if isinstance(a, np.ndarray):
            assert a.shape == b.shape, name
            if np.issubdtype(a.dtype, np.integer):
                assert np.array_equal(a, b), name
            else:
                assert _within(a, b, 1e-9), name
        elif isinstance(a, float):
            assert abs(a - b) <= 1e-9, (name, a, b)
        else:
            assert a == b and type(a) is type(b), (name, a, b)


def compare(
    rows: list[tuple[np.ndarray, list[int]]], settings: SamplingSettings, report_k: int, seeds: tuple[int, ...] = SEEDS
) -> None:
    for seed in seeds:
        olds, old_next = old_results(rows, settings, report_k, seed)
        new_rng = sampler.make_rng(seed)
        for (logits, history), old in zip(rows, olds, strict=True):
            new = sampler.sample(logits, history, settings, new_rng, report_k)
            same(old, new)
        # the generators were used alike: the next draws are the same
        assert old_next == new_rng.random()


def compare_forced(rows: list[tuple[np.ndarray, list[int]]], settings: SamplingSettings) -> None:
    """The hand-picked token: the most likely, one the filters may keep, the least likely
    (which they cut unless none is on)."""
    cache = getattr(rows, "reference", {})
    for i, (logits, history) in enumerate(rows[::3]):
        if ("order", i) not in cache:  # the row's order, sorted once (Gemma's: 262,144 logits) for every settings
            cache[("order", i)] = np.argsort(-logits, kind="stable")
        order = cache[("order", i)]
        for token in (int(order[0]), int(order[3]), int(order[-1])):
            rng = sampler.make_rng(9)
            key = ("forced", settings, i, token)
            if key not in cache:
                cache[key] = reference.sample(logits, history, settings, reference.make_rng(9), 10, force=token)
            old = cache[key]
            new = sampler.sample(logits, history, settings, rng, 10, force=token)
            same(old, new)
            assert new.token_id == token


@pytest.mark.parametrize("report_k", [10, 40])
@pytest.mark.usefixtures("sampler_path")
def test_the_chain_gives_what_the_old_sampler_gave_on_the_default_model(smol_rows, report_k: int) -> None:
    for settings in GRID:
        compare(smol_rows, settings, report_k)


@pytest.mark.usefixtures("sampler_path")
def test_the_chain_gives_what_the_old_sampler_gave_on_gemma(gemma_rows) -> None:
    for settings in GRID:
        compare(gemma_rows, settings, 40, seeds=SEEDS[:2])


@pytest.mark.usefixtures("sampler_path")
def test_the_forced_token_is_reported_as_before_on_both_models(smol_rows, gemma_rows) -> None:
    for rows in (smol_rows, gemma_rows):
        for settings in GRID[::3]:
            compare_forced(rows, settings)


@pytest.mark.usefixtures("sampler_path")
def test_a_report_of_one_candidate(smol_rows) -> None:
    """report_k 1 (the engine's pending_probs asks for one)."""
    for settings in GRID[::2]:
        compare(smol_rows[:6], settings, 1)


def test_the_reference_is_the_old_sampler_unchanged() -> None:
    """The reference is today's sampler byte for byte: its hash at commit 84b3239."""
    import hashlib

    text = Path(__file__).with_name("reference_sampler.py").read_bytes()
    assert hashlib.sha256(text).hexdigest() == REFERENCE_SHA256


REFERENCE_SHA256 = "259d377654459ca5bffff49a8851813aeabfaa3f7eb601d9b5a11254838a77e0"
