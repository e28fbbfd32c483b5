"""Python calls made inside a block (the cost tests' measure: a count, not a time, so a busy
machine moves it not at all): `sys.setprofile`'s "call" events, C functions not counted."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def python_calls() -> Iterator[list[int]]:
    """`with python_calls() as n:` ... then n[0] is how many Python calls the block made."""
    count = [0]

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        count[0] += event == "call"

    sys.setprofile(profile)
    try:
        yield count
    finally:
        sys.setprofile(None)
