"""Scratch arrays of the vocabulary's size, kept from step to step (the sampler's)."""

from __future__ import annotations

import threading

import numpy as np


class _Scratch(threading.local):
    """Arrays of the vocabulary's size, reused from step to step (one set per thread).

    A new array that large is new memory: glibc hands freed blocks of a few MB back to
    the system, so each fresh one page-faults on every 4 KiB page it writes. On a large
    vocabulary those faults cost more than the arithmetic (docs/performance.md, "Figures
    behind the code's choices", "The sampler's numpy"). Every result that leaves `sample`
    is a fresh (small) array, never one of these.
    """

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.groups: dict[str, tuple[np.ndarray, ...]] = {}

    def get(self, name: str, n: int, dtype: type) -> np.ndarray:
        """An uninitialised array of n entries: this thread's `name` buffer, or a view of its first n."""
        a = self.arrays.get(name)
        if a is None or a.shape[0] < n:
            a = self.arrays[name] = np.empty(n, dtype=dtype)
        return a if a.shape[0] == n else a[:n]  # (the buffer itself where it is that long: no view made)

    def group(self, name: str, n: int, dtypes: tuple[type, ...]) -> tuple[np.ndarray, ...]:
        """Uninitialised arrays of at least n entries, one per dtype, this thread's `name` set:
        taken in one lookup (a kernel call that fills several), whole (not views of n)."""
        g = self.groups.get(name)
        if g is None or g[0].shape[0] < n:
            g = self.groups[name] = tuple(np.empty(n, dtype=t) for t in dtypes)
        return g


scratch = _Scratch()
