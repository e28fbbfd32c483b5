"""Counting the garbage that only Python's cycle collector can free."""

from __future__ import annotations

import collections
import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cyclic_garbage() -> Iterator[collections.Counter]:
    """With the cycle collector off inside the block, count by type name the objects
    it then finds unreachable (garbage that reference counting alone never frees)."""
    found: collections.Counter = collections.Counter()
    gc.collect()
    gc.disable()
    try:
        yield found
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found.update(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
