"""Argument types the commands share (argparse's `type=`): a bad value is argparse's one
line, naming the option and what it takes."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def whole_number(least: int, says: str, most: int | None = None) -> Callable[[str], int]:
    """A whole number of at least `least` (and at most `most`); else `says`, with `{text}` the value given (quoted)."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = least - 1
        if n < least or (most is not None and n > most):
            raise argparse.ArgumentTypeError(says.replace("{text}", repr(text)))
        return n

    return parse
