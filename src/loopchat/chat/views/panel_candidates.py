"""The loop panel's table of candidates: the top tokens of a pass, raw softmax and after
sampling, the drawn one marked ▶ (and added under the table when it is not among them);
a remote server's log-probabilities in one column."""

from __future__ import annotations

from loopchat.chat.plots import bar, cell, fmt_prob, token_face
from loopchat.chat.views.lines import Line, Pieces, fit_line
from loopchat.chat.views.panel_view import (
    DIM,
    DRAWN,
    LABEL,
    NONE,
    RAW_BAR,
    SAMPLED_BAR,
    TOKEN,
    PanelView,
)
from loopchat.event_lines import NOT_GIVEN
from loopchat.events import Candidate, Step


def is_drawn(c: Candidate, s: Step) -> bool:
    """Whether candidate `c` is the token step `s` drew (a server that sends no token ids:
    the same text with the same probability)."""
    if s.token_id is not None:
        return c.token_id == s.token_id
    return c.text == s.piece and c.prob == s.raw_prob


def candidates(v: PanelView, width: int, k: int | None = None, bars: bool = True) -> list[Line]:
    """The top-k table as screen lines, columns one space apart (like a rich Table.grid)."""
    s = v.step
    assert s is not None
    rows: tuple[Candidate, ...] = s.raw_top[:k] if k else s.raw_top
    if s.sampled_top is None:  # a server's logprobs: no sampled-from distribution
        return server_candidates(v, s, rows, width, bars)
    sampled = s.sampled_top
    probs = {c.token_id: c.prob for c in sampled}
    complete = s.candidates_kept is not None and s.candidates_kept <= len(sampled)  # every kept token is listed
    token_w = 10 if v.width >= 44 else 8
    # marker 1 + token + 4 gaps + 2 x (bar + 6-wide percentage)
    bar_w = max(4, min(12, (v.width - 2 - token_w - 4 - 12) // 2)) if bars else 0
    # narrower than the table (a very small terminal): the token column gives way
    token_w = max(1, min(token_w, width - (18 + 2 * bar_w if bars else 16)))
    out: list[Line] = []
    head: Pieces = [(f"  {'top ' + str(len(rows)):<{token_w}} ", LABEL)]
    if bars:
        head.append((f"{'raw softmax':<{bar_w + 7}}", LABEL))
    else:
        head.append((f"{'raw':>6} ", LABEL))
    head.append(("after sampling" if bars else "sampled", LABEL))
    fit_line(head, width, out, no_wrap=True)
    drawn_listed = False
    for c in rows:
        drawn = c.token_id == s.token_id
        drawn_listed |= drawn
        sp = probs.get(c.token_id)
        style = DRAWN if drawn else None
        t = _row_start(c, drawn, token_w)
        if bars:
            t.append((bar(c.prob, bar_w), RAW_BAR))
            t.append((" ", NONE))
        t.append((cell(fmt_prob(c.prob), 6, right=True), style or NONE))
        t.append((" ", NONE))
        if bars:
            t.append((bar(sp or 0.0, bar_w), SAMPLED_BAR))
            t.append((" ", NONE))
        if sp is None:
            t.append((cell("cut" if complete else "–", 6, right=True), style or DIM))
        else:
            t.append((cell(fmt_prob(sp), 6, right=True), style or NONE))
        out.append(tuple(t))
    if not drawn_listed:
        t = [("▶", DRAWN), (" ", NONE), (cell(token_face(s.piece, s.piece_bytes), token_w), DRAWN), (" ", NONE)]
        if bars:
            t.append((cell(f"rank {s.raw_rank}", bar_w), LABEL))
            t.append((" ", NONE))
        t.append((cell(_prob(s.raw_prob), 6, right=True), DRAWN))
        t.append((" ", NONE))
        if bars:
            t.append((cell(f"rank {s.sampled_rank}", bar_w), LABEL))
            t.append((" ", NONE))
        t.append((cell(_prob(s.sampled_prob), 6, right=True), DRAWN))
        out.append(tuple(t))
    return out


def server_candidates(v: PanelView, s: Step, rows: tuple[Candidate, ...], width: int, bars: bool) -> list[Line]:
    """A remote server's top log-probabilities (as probabilities): one column, since the
    distribution the server sampled from is not given."""
    out: list[Line] = []
    if s.raw_prob is None and not rows:
        fit_line([("  candidates ", LABEL), (NOT_GIVEN, DIM), (" (the server sent no logprobs)", LABEL)], width, out)
        return out
    token_w = 10 if v.width >= 44 else 8
    bar_w = max(4, min(20, v.width - 2 - token_w - 2 - 6 - 1)) if bars else 0
    token_w = max(1, min(token_w, width - (10 + bar_w if bars else 8)))
    head: Pieces = [
        (f"  {'top ' + str(len(rows)):<{token_w}} ", LABEL),
        ("server's logprobs" if bars else "logprobs", LABEL),
    ]
    fit_line(head, width, out, no_wrap=True)
    drawn_listed = False
    for c in rows:
        drawn = is_drawn(c, s)
        drawn_listed |= drawn
        style = DRAWN if drawn else None
        t = _row_start(c, drawn, token_w)
        if bars:
            t += [(bar(c.prob, bar_w), RAW_BAR), (" ", NONE)]
        t.append((cell(fmt_prob(c.prob), 6, right=True), style or NONE))
        out.append(tuple(t))
    if not drawn_listed:
        rank = f"rank {s.raw_rank}" if s.raw_rank is not None else f"not in top {len(s.raw_top)}"
        t = [("▶", DRAWN), (" ", NONE), (cell(token_face(s.piece, s.piece_bytes), token_w), DRAWN), (" ", NONE)]
        if bars:
            t += [(cell(rank, bar_w), LABEL), (" ", NONE)]
        t.append((cell(fmt_prob(s.raw_prob) if s.raw_prob is not None else "–", 6, right=True), DRAWN))
        out.append(tuple(t))
    return out


def _prob(p: float | None) -> str:
    """A probability in a 6-wide cell; a dash where it is not given (a server without logprobs)."""
    return fmt_prob(p) if p is not None else "—"


def _row_start(c: Candidate, drawn: bool, token_w: int) -> Pieces:
    """A candidate's row up to its bars: the drawn mark and the token's face."""
    return [
        ("▶" if drawn else " ", DRAWN),
        (" ", NONE),
        (cell(token_face(c.text, c.piece_bytes), token_w), DRAWN if drawn else TOKEN),
        (" ", NONE),
    ]
