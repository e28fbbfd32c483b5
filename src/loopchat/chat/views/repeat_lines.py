"""The loop panel's line for a reply that repeats itself at the step shown (Step.repeat,
repeats.py): 'repeating: tokens 301–340 repeat 261–300'. Under the panel's title, in the
full and the compact panel alike; nothing when the step is not repeating."""

from __future__ import annotations

from rich.style import Style

from loopchat.engine.repeats import repeat_of_step
from loopchat.events import Step

#: the same plum as the transcript's mark on a repeated token (token_styles.REPEAT_BG)
REPEATING = Style.parse("bold #ff87ff on #5f2f5f")


def repeat_lines(step: Step) -> list[list[tuple[str, Style]]]:
    rep = repeat_of_step(step.index, step.repeat)
    return [] if rep is None else [[(rep.describe(), REPEATING)]]
