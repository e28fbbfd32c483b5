"""A finished reply as Markdown (F4): Rich's Markdown, with an ordered list's numbers as
they were written (`1.`; Rich draws ` 1`), no blank line before the reply's first block
(Rich puts one before a list that opens the text), and the reply's single newlines kept
as line breaks."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TypeVar

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markdown import ListItem, Markdown
from rich.segment import Segment

T = TypeVar("T")

_BLOCK_START = re.compile(r"^\s*([-*+]\s|\d+[.)]\s|#|>|\||```|~~~)")


def hard_line_breaks(text: str) -> str:
    """Markdown joins single newlines into one paragraph; a chat reply (a poem, an
    address) means them as line breaks. Mark them as hard breaks, except inside code
    fences and where the next line starts a block of its own (list, heading, quote)."""
    lines = text.split("\n")
    out, fenced = [], False
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if (
            not fenced
            and line.strip()
            and nxt.strip()
            and not _BLOCK_START.match(nxt)
            and not line.lstrip().startswith(("#", "|", "```", "~~~"))
        ):
            line = line.rstrip() + "\\"
        out.append(line)
    return "\n".join(out)


class NumberedItem(ListItem):
    """An ordered list's item numbered `1.` (Rich's own drops the period)."""

    def render_number(self, console: Console, options: ConsoleOptions, number: int, last_number: int) -> RenderResult:
        number_width = len(str(last_number)) + 3  # " 12. "
        lines = console.render_lines(
            self.elements, options.update(width=options.max_width - number_width), style=self.style
        )
        number_style = console.get_style("markdown.item.number", default="none")
        numeral = Segment(f"{number}.".rjust(number_width - 1) + " ", number_style)
        padding = Segment(" " * number_width, number_style)
        for i, line in enumerate(lines):
            yield numeral if i == 0 else padding
            yield from line
            yield Segment("\n")


class ReplyMarkdown(Markdown):
    elements = {**Markdown.elements, "list_item_open": NumberedItem}

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        return _without_leading_blank_lines(super().__rich_console__(console, options))


def _without_leading_blank_lines(segments: Iterable[T]) -> Iterator[T]:
    started = False
    for seg in segments:
        if not started and isinstance(seg, Segment) and seg.text == "\n":
            continue
        started = True
        yield seg


def reply_markdown(text: str) -> ReplyMarkdown:
    """A reply's text as it is drawn with F4 on."""
    return ReplyMarkdown(hard_line_breaks(text))
