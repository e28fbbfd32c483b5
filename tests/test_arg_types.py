"""The commands' shared argument type: a whole number of at least a floor, else one line."""

from __future__ import annotations

import argparse

import pytest

from loopchat.arg_types import whole_number
from loopchat.serve.command import queue_size


def test_a_whole_number_at_or_above_the_floor_is_taken() -> None:
    assert whole_number(1, "{text}: one or more")("3") == 3
    assert queue_size("0") == 0


@pytest.mark.parametrize("text", ["-1", "x", "1.5", ""])
def test_anything_else_is_one_line_naming_the_value(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        queue_size(text)
    assert str(info.value) == f"{text!r}: --queue is how many requests may wait, 0 or more"
    assert "\n" not in str(info.value)
