"""A header's row of figures (`prompt 387 tokens · KV cache: 372 reused, 15 evaluated ·
reply 23 tokens`) laid out at a width: broken between its figures, at their " · ", never
inside one ("15 / evaluated"), unless a figure alone is wider than the row."""

from __future__ import annotations

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text

from loopchat.chat.views.lines import Line, text_to_lines

SEP = " · "

Pieces = list[tuple[str, Style]]


def _figures(pieces: Pieces) -> list[Pieces]:
    """The pieces cut into figures; each figure after the first starts with its SEP."""
    out: list[Pieces] = [[]]
    for text, style in pieces:
        for i, part in enumerate(text.split(SEP)):
            if i:
                out.append([(SEP, style)])
            if part:
                out[-1].append((part, style))
    return [f for f in out if f]


def _wrapped(pieces: Pieces, width: int) -> list[Line]:
    t = Text()
    for s, style in pieces:
        t.append(s, style)
    return text_to_lines(t, width)


def figure_rows(pieces: Pieces, width: int) -> list[Line]:
    """One logical row at `width`: as it is if it fits, else one row per run of whole
    figures (a row's first figure without its SEP); a figure wider than the row wraps."""
    if sum(cell_len(p) for p, _ in pieces) <= width:
        return [tuple(pieces)]
    rows: list[Line] = []
    row: Pieces = []
    used = 0
    for figure in _figures(pieces):
        n = sum(cell_len(p) for p, _ in figure)
        if row and used + n > width:
            rows.append(tuple(row))
            row, used = [], 0
        if not row and figure[0][0] == SEP:
            figure, n = figure[1:], n - len(SEP)
        if n > width:
            rows.extend(_wrapped(figure, width))
            continue
        row.extend(figure)
        used += n
    if row:
        rows.append(tuple(row))
    return rows
