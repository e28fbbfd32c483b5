"""Screen lines without Textual: a `Line` is one row of the screen as (text, rich Style)
pieces, left to right, that already fits the width it was made for. The views' models
build them; the widgets (tui/fast_static.py) turn each into a Strip once.

A logical line (`Pieces`) is fitted to a width exactly as rich would print it:
word-wrapped, or cut with an ellipsis."""

from __future__ import annotations

import io

from rich.cells import cell_len
from rich.console import Console
from rich.style import Style
from rich.text import Text

#: One screen line: (text, style) pieces, left to right.
Line = tuple[tuple[str, Style], ...]
#: One logical line, before fitting to the width.
Pieces = list[tuple[str, Style]]

BLANK: Line = ()

_CONSOLE = Console(width=1000, file=io.StringIO(), color_system=None, legacy_windows=False)


def lines_to_text(lines: list[Line]) -> Text:
    """The lines as one Text (for tests and for code that reads what is shown)."""
    t = Text()
    for i, line in enumerate(lines):
        if i:
            t.append("\n")
        for s, style in line:
            t.append(s, style)
    return t


def text_to_lines(text: Text, width: int) -> list[Line]:
    """`text` wrapped (or cut, if no_wrap) to `width` exactly as rich prints it, as Lines."""
    out: list[Line] = []
    for t in text.wrap(_CONSOLE, width):
        out.append(tuple((seg.text, seg.style or Style.null()) for seg in t.render(_CONSOLE, end="") if seg.text))
    return out


def width_of(pieces: Pieces | Line) -> int:
    n = 0
    for s, _ in pieces:
        n += len(s) if s.isascii() else cell_len(s)
    return n


def _to_text(pieces: Pieces, no_wrap: bool = False) -> Text:
    t = Text(no_wrap=no_wrap, overflow="ellipsis")
    for s, style in pieces:
        t.append(s, style)
    return t


def fit_line(pieces: Pieces, width: int, out: list[Line], no_wrap: bool = False) -> None:
    """Append one logical line to `out` as screen lines: word-wrapped (or cut with an
    ellipsis, if no_wrap) exactly as rich would print it."""
    if width_of(pieces) <= width:
        out.append(tuple(pieces))
    else:
        out.extend(text_to_lines(_to_text(pieces, no_wrap), width))


def fit_lines(lines: list[Pieces], width: int, out: list[Line] | None = None, no_wrap: bool = False) -> list[Line]:
    """Logical lines as screen lines (appended to `out`, if given); returns the list."""
    out = [] if out is None else out
    for pieces in lines:
        fit_line(pieces, width, out, no_wrap)
    return out


def rstrip(pieces: Pieces) -> None:
    """Trailing blanks off the logical line, in place."""
    while pieces:
        s, style = pieces[-1]
        s = s.rstrip()
        if s:
            pieces[-1] = (s, style)
            return
        pieces.pop()
