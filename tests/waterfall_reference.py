"""An independent numpy reference of the sampler's waterfall (docs/trace-format.md,
"Sampler stages"): every stage's report recomputed from the logits with a full stable sort
and float64 sums, from the definitions alone (no loopchat code but DRY's penalties, which
test_dry.py checks on their own)."""

from __future__ import annotations

import math

import numpy as np

from loopchat.engine import dry
from loopchat.settings import SamplingSettings

Row = tuple[str, int, float, int, float, int, float, int, float]


def mass_unit(logits: np.ndarray) -> float:
    """The raw softmax's denominator, as documented: numpy's float32 sum of float32 exps."""
    return float(np.exp(logits - np.float32(logits.max())).sum())


def _changer(name: str, work: np.ndarray, new: np.ndarray, raw_max: float, unit: float) -> tuple[Row, float]:
    """A stage that changes logits: (its row, the new mass unit)."""
    diff = np.flatnonzero(new != work)
    before = np.exp(work.astype(np.float64) - raw_max)
    after = np.exp(new.astype(np.float64) - raw_max)
    new_unit = unit + float(after[diff].sum() - before[diff].sum())
    # the total variation distance, the unchanged tokens holding together what the unit
    # leaves of the changed ones (the unit is a float32 sum: not quite their float64 sum)
    rest = unit - float(before[diff].sum())
    changed = float(np.abs(after[diff] / new_unit - before[diff] / unit).sum())
    moved = 0.5 * (changed + abs(rest / unit - rest / new_unit)) if diff.size else 0.0
    return (name, 0, 0.0, len(work), 1.0, -1, 0.0, int(diff.size), moved), new_unit


def waterfall(logits: np.ndarray, recent: list[int], s: SamplingSettings) -> list[Row]:
    """Each stage's (stage, removed, removed_mass, kept, kept_mass, cut_id, cut_prob,
    changed, moved_mass), as documented."""
    n, raw_max, unit = len(logits), float(logits.max()), mass_unit(logits)
    work, rows = logits.copy(), []
    new = work.copy()
    if s.repeat_penalty != 1.0 and s.repeat_last_n > 0:
        for t in set(recent[-s.repeat_last_n :]):
            new[t] = new[t] / np.float32(s.repeat_penalty) if new[t] > 0 else new[t] * np.float32(s.repeat_penalty)
    row, unit = _changer("repeat_penalty", work, new, raw_max, unit)
    rows.append(row)
    work = new.copy()
    if s.frequency_penalty or s.presence_penalty:  # each token held k times: k * frequency + presence off
        window = recent[-s.repeat_last_n :] if s.repeat_last_n > 0 else []
        for t in set(window):
            k = np.float32(window.count(t))
            new[t] = new[t] - (k * np.float32(s.frequency_penalty) + np.float32(s.presence_penalty))
        row, unit = _changer("frequency_presence", work, new, raw_max, unit)
        rows.append(row)
        work = new.copy()
    ids, pen = dry.step_penalties(recent, s, n)
    new[ids] = new[ids] - pen
    row, unit = _changer("dry", work, new, raw_max, unit)
    rows.append(row)
    work = new.copy()
    if s.logit_bias:
        for t, b in s.logit_bias:
            new[t] = new[t] + np.float32(b)
        row, unit = _changer("logit_bias", work, new, raw_max, unit)
        rows.append(row)
        work = new.copy()
    w = work.astype(np.float64)
    p = np.exp(w - raw_max) / unit
    order = np.argsort(-w, kind="stable")
    held = 1.0

    def cut(name: str, n_keep: int) -> None:
        nonlocal order, held
        gone = order[n_keep:]
        mass = 0.0
        if gone.size:  # (the kept mass in the unit; removed: what the row above held less it)
            kept = float(p[order[:n_keep]].sum())
            mass, held = held - kept, kept
        first = int(gone[0]) if gone.size else -1
        rows.append((name, len(gone), mass, n_keep, held, first, float(p[first]) if first >= 0 else 0.0, 0, 0.0))
        order = order[:n_keep]

    if s.temperature == 0:
        cut("greedy", 1)
        return rows
    cut("top_k", s.top_k if 0 < s.top_k < n else len(order))
    if s.top_p < 1.0 and len(order) > 1:
        q = np.cumsum(p[order]) / p[order].sum()
        cut("top_p", min(int(np.searchsorted(q, s.top_p, side="left")) + 1, len(order)))
    else:
        cut("top_p", len(order))
    if s.min_p > 0:
        cut("min_p", max(int(np.count_nonzero(w[order] >= w[order[0]] + math.log(s.min_p))), 1))
    else:
        cut("min_p", len(order))
    cut("temperature", len(order))
    return rows
