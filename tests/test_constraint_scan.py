"""The constraint stage in one pass (issue 24: the constraint's cost). The C kernel's
`constraint_scan` gives numpy's figures on rows and masks made to break it (no token allowed,
all, one, all but one, runs, bits past the vocabulary, ties, -inf, lengths that are not a
multiple of the vector width); on the real default model's logits, with penalties, the stage
gives the same figures on both paths (the kernel's pass, numpy's passes) and the documented
ones (docs/trace-format.md, "The constraint"), top-k's cut after it included; and equal
forbidden logits name the lowest id, as documented, whatever order the raw top holds them in."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sampler_paths import built_kernel

from loopchat.constraint import Constraint
from loopchat.engine import sampler_fused
from loopchat.engine.sampler import make_rng, sample, top_indices
from loopchat.settings import SamplingSettings


def _bits(words: np.ndarray, n: int) -> np.ndarray:
    return np.unpackbits(words.view(np.uint8), count=n, bitorder="little").astype(bool)


def _reference(x: np.ndarray, work: np.ndarray, words: np.ndarray, shift: float) -> tuple:
    """(count, total, side, work_side, top, allowed ids) from the definitions, in numpy float64."""
    n = x.shape[0]
    bits = _bits(words, n)
    count = int(bits.sum())
    e, ew = np.exp(x.astype(np.float64) - shift), np.exp(work.astype(np.float64) - shift)
    side = ~bits if count * 2 > n else bits  # the smaller side
    top = -1
    if count < n:
        finite = np.where(bits | np.isnan(x), -np.inf, x.astype(np.float64))
        top = int(np.flatnonzero(~bits & (finite == finite.max()))[0])
    return count, float(e.sum()), float(e[side].sum()), float(ew[side].sum()), top, np.flatnonzero(bits)


def _masks(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    """Bit masks over n tokens, padded to whole 32-bit words with garbage past n."""
    width = (n + 31) // 32 * 32
    out = [np.zeros(width, bool), np.ones(width, bool)]
    one = np.zeros(width, bool)
    one[rng.integers(0, n)] = True
    out += [one, ~one, rng.random(width) < 0.5, rng.random(width) < 0.97, rng.random(width) < 0.03]
    runs = np.repeat(rng.random(width // 16 + 1) < 0.6, 16)[:width]  # what a grammar's mask looks like
    out += [runs, runs ^ (rng.random(width) < 0.01)]
    for m in out:
        m[n:] = rng.random(width - n) < 0.5
    return out


def test_the_scan_gives_numpys_figures_on_rows_made_to_break_it() -> None:
    k = built_kernel()
    rng = np.random.default_rng(24)
    lengths = [1, 2, 7, 8, 9, 31, 32, 33, 63, 64, 65, 257, 1000, 49_152, 49_157]
    checked = 0
    for n in lengths:
        for kind in ("normal", "ties", "-inf"):
            x = (rng.standard_normal(n) * 4).astype(np.float32)
            if kind == "ties":  # equal logits: the top forbidden one is the lowest id
                x = np.round(x).astype(np.float32)
            elif kind == "-inf":
                x[rng.integers(0, n, max(n // 5, 1))] = -np.inf
            shift = float(x.max()) if np.isfinite(x.max()) else 0.0
            work = x.copy()
            changed = rng.integers(0, n, min(n, 40))
            work[changed] = work[changed] * np.float32(1.3) - np.float32(0.5)  # the penalties' copy
            for mask in _masks(rng, n):
                words = np.packbits(mask, bitorder="little").view(np.int32)
                count, total, side, work_side, top, allowed = _reference(x, work, words, shift)
                for w in (None, work):
                    ids, src = np.full(n, -5, dtype=np.int64), np.full(n, np.nan, dtype=np.float32)
                    got = k.constraint_scan(x, w, words, shift, ids, src)
                    assert got[0] == count, (n, kind)
                    if count == 0 or count == n:  # nothing to measure: nothing summed
                        assert got[1:] == (0.0, 0.0, 0.0, -1, -np.inf)
                        continue
                    assert got[1] == k.exp_sum(x, shift, None)  # the total: exp_sum's very bits
                    assert abs(got[1] - total) <= 1e-12 * total and abs(got[2] - side) <= 1e-12 * total
                    assert abs(got[3] - (side if w is None else work_side)) <= 1e-12 * total
                    assert got[4] == top, (n, kind, got[4], top)
                    assert np.array_equal(ids[:count], allowed), (n, kind)  # (the allowed ids, in order)
                    if count * 2 > n:  # most allowed: their (penalized) logits too
                        values = (x if w is None else w)[allowed]
                        assert np.array_equal(src[:count], values) and got[5] == values.max()
                        assert k.constraint_scan(x, w, words, shift, ids, None)[:5] == got[:5]
                    checked += 1
    assert checked > 400


@pytest.mark.parametrize("threads", [1, 2])
def test_the_scans_exps_are_top_ps(threads: int) -> None:
    """constraint_scan's `q`: the allowed tokens' float64 exps at the shift, of the values it gathers
    (the penalized logits' where work is given), the very bits exp_sum computes for those values; and
    exp_sum_above reading them (`stored`) gives the total, the deep set and its masses it computes
    itself, on one thread or two (rows longer than a part: the parts' order), tails included."""
    k = built_kernel()
    k.set_threads(threads, 0)
    rng = np.random.default_rng(9)
    checked = 0
    try:
        for n in (1001, 8200, 49_152, 70_001, 262_144):
            for kind in ("normal", "ties", "-inf", "penalized"):
                x = (rng.standard_normal(n) * 4).astype(np.float32)
                if kind == "ties":
                    x = np.round(x).astype(np.float32)
                elif kind == "-inf":
                    x[rng.integers(0, n, n // 5)] = -np.inf
                work = None
                if kind == "penalized":  # (a few logits changed: groups of eight with and without one)
                    work = x.copy()
                    changed = rng.integers(0, n, 300)
                    work[changed] = work[changed] * np.float32(1.3) - np.float32(0.5)
                for mask in _masks(rng, n)[4:]:
                    mask[: n // 3] = True  # (most allowed, in runs)
                    words = np.packbits(mask, bitorder="little").view(np.int32)
                    shift = float(x.max())
                    ids, src, q = np.full(n, -5, np.int64), np.full(n, np.nan, np.float32), np.full(n, np.nan)
                    sample = np.full(n // 32 + 1, np.nan, np.float32)
                    got = k.constraint_scan(x, work, words, shift, ids, src, q, sample)
                    plain = k.constraint_scan(x, work, words, shift, np.empty(n, np.int64), np.empty(n, np.float32))
                    assert got[:6] == plain
                    count = got[0]
                    assert got[6] == (n > count and count * 2 > n)  # (written where most, not all, are allowed)
                    if not got[6]:
                        continue
                    values = src[:count].copy()
                    # (src[::32] beside them, top-p's strided sample: chain24)
                    assert sample[: (count + 31) // 32].tobytes() == values[::32].tobytes(), (n, kind)
                    want = np.full(count, np.nan)
                    total = k.exp_sum(values, shift, want)
                    assert np.array_equal(q[:count].view(np.int64), want.view(np.int64)), (n, kind)
                    picks, picked = ids[:count].copy(), np.empty(count)
                    assert k.exp_sum_above(values, shift, np.nan, picks, picked, q[:count], True)[0] == total
                    v = float(np.sort(values)[-max(count // 30, 1)])
                    out = []
                    for stored in (False, True):
                        full = q[:count].copy() if stored else np.full(count, np.nan)
                        i2, q2 = np.full(count, -1, np.int64), np.full(count, np.nan)
                        t, kept = k.exp_sum_above(values, shift, v, i2, q2, full, stored)
                        out.append((t, i2[:kept].tolist(), q2[:kept].tobytes(), full.tobytes()))
                    assert out[0] == out[1], (n, kind)
                    checked += 1
    finally:
        k.set_threads(1, 32_768)
    assert checked >= 30


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}, "required": ["name"]}


def _both_paths(logits, context, settings, stages, kernel):
    """The chain on the kernel's path, then on numpy's (each with its own stage, in the same state)."""
    out = []
    for stage, path in zip(stages, (kernel, None)):
        sampler_fused.kernel = path
        res = sample(logits, context, settings, make_rng(3), 10, constraint=stage)
        out.append((res, stage.report))
    return out


@pytest.mark.model
@pytest.mark.filterwarnings("ignore:llama_token_get_attr:DeprecationWarning")
def test_the_stage_on_both_paths_gives_the_documented_figures_with_penalties(engine, monkeypatch) -> None:
    """A reply under a JSON schema (passes that allow a few tokens and passes that allow nearly all,
    inside the string), penalized logits, top-k 40 after the constraint: at every pass both paths
    give the ConstraintReport of the definitions, the same stage reports (kept mass to 1e-12) and
    the same top-k cut (the largest allowed logit left out, its lowest id); with top-k off (the
    allowed logits as the kernel's pass gathered them) the same distribution."""
    kernel = built_kernel()
    monkeypatch.setattr(sampler_fused, "kernel", kernel)
    c = Constraint("json_schema", json.dumps(SCHEMA), "test.json")
    stages = [engine.open_constraint(c), engine.open_constraint(c)]
    settings = SamplingSettings().replace(top_k=40, temperature=1.5, repeat_penalty=1.3, dry_multiplier=0.8)
    # top-k off: the later stages read the allowed logits the kernel's pass gathered (source_cache)
    unsorted = [settings.replace(top_k=0, top_p=p, min_p=m) for p, m in ((1.0, 0.0), (1.0, 0.05), (0.95, 0.0))]
    engine.reset()
    prompt = engine.llm.tokenize(
        b"<|im_start|>user\nA JSON name please<|im_end|>\n<|im_start|>assistant\n", special=True
    )
    engine.evaluate(prompt)
    context, seen = list(prompt), set()
    for _ in range(24):
        logits = engine.logits().copy()
        (res, report), (res_np, report_np) = _both_paths(logits, context, settings, stages, kernel)
        bits = stages[0].allowed_bits()
        l64 = logits.astype(np.float64)
        w = np.exp(l64 - l64.max())
        assert report.allowed == int(bits.sum()) == report_np.allowed
        assert abs(report.forbidden_mass - (1.0 - w[bits].sum() / w.sum())) <= 1e-9
        if report.allowed < engine.n_vocab:
            top = int(np.argmax(np.where(bits, -np.inf, l64)))
            assert report.top_forbidden_id == top == report_np.top_forbidden_id
            assert abs(report.top_forbidden_prob - w[top] / w.sum()) <= 1e-12
        assert abs(report.forbidden_mass - report_np.forbidden_mass) <= 1e-12
        for a, b in zip(res.stages, res_np.stages):
            assert (a.stage, a.removed, a.kept, a.cut_id) == (b.stage, b.removed, b.kept, b.cut_id)
            assert abs(a.kept_mass - b.kept_mass) <= 1e-12 and abs(a.removed_mass - b.removed_mass) <= 1e-12
        top_k = next(s for s in res.stages if s.stage == "top_k")
        if top_k.removed:  # the cut: the largest allowed penalized logit not kept, its lowest id
            work = logits.copy()
            for t in set(context[-settings.repeat_last_n :]):
                work[t] = work[t] / np.float32(1.3) if work[t] > 0 else work[t] * np.float32(1.3)
            kept = top_indices(np.where(bits, work, -np.inf), 40)
            rest = np.where(bits, work, -np.inf)
            rest[kept] = -np.inf
            # (DRY's few penalties may move it: the cut is then checked between the paths above)
            if not res.stages[1].changed:
                assert top_k.cut_id == int(np.argmax(rest))
        for other in unsorted:
            (a, _), (b, _) = _both_paths(logits, context, other, stages, kernel)
            assert a.kept == b.kept and np.array_equal(a.sampled_top_ids, b.sampled_top_ids)
            assert np.allclose(a.sampled_top_probs, b.sampled_top_probs, rtol=0, atol=1e-12)
            assert abs(a.sampled_entropy - b.sampled_entropy) <= 1e-9 and bits[a.token_id] and bits[b.token_id]
            assert [(r.removed, r.kept, r.cut_id) for r in a.stages] == [
                (r.removed, r.kept, r.cut_id) for r in b.stages
            ]
        seen.add("many" if report.allowed * 2 > engine.n_vocab else "few")
        token = res.token_id
        assert all(s.consume(token) for s in stages)
        context.append(token)
        if stages[0].stopped:
            break
        engine.forward(token)
    assert seen == {"many", "few"}


@pytest.mark.model
@pytest.mark.filterwarnings("ignore:llama_token_get_attr:DeprecationWarning")
def test_equal_forbidden_logits_name_the_lowest_id_on_both_paths(engine, monkeypatch) -> None:
    """The most likely forbidden token, where several forbidden tokens share the largest logit:
    the lowest id (docs/trace-format.md), not the first the raw top happens to list (its search
    orders equal logits its own way: here the highest id first)."""
    kernel = built_kernel()
    stage = engine.open_constraint(Constraint("regex", "[0-9]+", "digits"))
    bits = stage.allowed_bits()
    forbidden = np.flatnonzero(~bits)
    tied = [int(forbidden[np.searchsorted(forbidden, i)]) for i in (20, 300, 500, 9000, 40000)]
    logits = np.random.default_rng(5).standard_normal(engine.n_vocab).astype(np.float32)
    logits[tied] = 9.0
    assert int(top_indices(logits, 10)[0]) != min(tied)  # (the raw top lists another first)
    for path in (kernel, None):
        monkeypatch.setattr(sampler_fused, "kernel", path)
        res = sample(logits, [], SamplingSettings(), make_rng(1), 10, constraint=stage)
        r = stage.report
        assert r.top_forbidden_id == min(tied), (path, r.top_forbidden_id)
        assert bits[res.token_id] and r.allowed == int(bits.sum())
