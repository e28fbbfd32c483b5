"""The loop panel in step mode, the loop stopped before a draw: the die about to be
rolled (raw softmax and after sampling, numbered for the digit keys), its entropy, what
each stage of the sampler did to it, the token the last key put in, and the settings of
this draw.

On a short panel (80x24: under the transcript) it keeps the rows the keys need; what
gives way, first to last (`fit`): the blank lines; the key list (the die bar under the
panel says it too); the settings in full (they go on one line, and the key list comes
back if it fits); the key list again; candidates (down to 3); the entropy; the last draw.
The sampler's waterfall (panel_waterfall) goes to one line with the blanks, and away with
the key list.
"""

from __future__ import annotations

from loopchat.browser import key_here
from loopchat.chat.plots import bar, cell, fmt_prob, token_face
from loopchat.chat.views.fit import FULL, Form, Section, fit
from loopchat.chat.views.lines import BLANK, Line, Pieces, fit_line, fit_lines, width_of
from loopchat.chat.views.panel_view import (
    BOLD,
    DIM,
    DRAWN,
    HEAD,
    LABEL,
    NONE,
    PENDING,
    RAW_BAR,
    SAMPLED_BAR,
    TOKEN,
    PanelView,
)
from loopchat.chat.views.panel_waterfall import waterfall_lines, waterfall_short
from loopchat.events import Pending
from loopchat.settings import KNOBS, SETTING, SamplingSettings, fmt_value

# what gives way on a short panel, first to last (see the module's docstring)
BLANKS, KEYS, SETTINGS, KEYS_AGAIN, CANDIDATES, ENTROPY, LAST_DRAW = range(1, 8)

#: the keys of the die bar, as the stopped panel lists them
STOPPED_KEYS = "Enter draws · n draws 10 · 1–9 pick · / search · {f12} runs · Esc stops"


def last_draw(v: PanelView) -> Pieces | None:
    """Step mode: the token the step before the pending draw put in (what the last key did)."""
    p, r = v.pending, v.record
    if p is None or r is None or not r.steps or r.steps[-1].index != p.index - 1:
        return None
    s = r.steps[-1]
    how = {"hand": "picked by hand", "step": "drawn"}.get(s.chosen_by, "drawn (running freely)")
    sp = fmt_prob(s.sampled_prob) if s.sampled_prob else "cut"
    return [
        (f"token {s.index + 1} ", LABEL),
        (token_face(s.piece, s.piece_bytes), DRAWN),
        (f" {how} · ", LABEL),
        (f"{fmt_prob(s.raw_prob or 0.0)} raw, {sp} after sampling", NONE),
    ]


def _table(p: Pending, width: int, k: int) -> list[Line]:
    """The die's top `k` rows under their header, numbered for the digit keys (raw
    softmax order; a row the filters cut can be picked too)."""
    sampled = {c.token_id: c.prob for c in p.sampled_top}
    complete = p.candidates_kept <= len(p.sampled_top)
    token_w = 10 if width >= 44 else 8
    bar_w = max(4, min(12, (width - 4 - token_w - 4 - 12) // 2))
    out: list[Line] = []
    head: Pieces = [
        (f"    {'top ' + str(k):<{token_w}} ", LABEL),
        (f"{'raw softmax':<{bar_w + 7}}", LABEL),
        ("after sampling", LABEL),
    ]
    fit_line(head, width, out, no_wrap=True)
    for i, c in enumerate(p.raw_top[:k]):
        sp = sampled.get(c.token_id)
        t: Pieces = [
            (f"{i + 1:>2}  " if i < 9 else "    ", DRAWN),
            (cell(token_face(c.text, c.piece_bytes), token_w), TOKEN),
            (" ", NONE),
            (bar(c.prob, bar_w), RAW_BAR),
            (" ", NONE),
            (cell(fmt_prob(c.prob), 6, right=True), NONE),
            (" ", NONE),
            (bar(sp or 0.0, bar_w), SAMPLED_BAR),
            (" ", NONE),
            (
                cell(fmt_prob(sp) if sp is not None else ("cut" if complete else "–"), 6, right=True),
                NONE if sp is not None else DIM,
            ),
        ]
        fit_line(t, width, out, no_wrap=True)
    return out


def _entropy(p: Pending, width: int) -> list[Line]:
    kept = p.candidates_kept
    line: Pieces = [
        ("entropy ", LABEL),
        (f"{p.raw_entropy:.2f} → {p.sampled_entropy:.2f} bits", NONE),
        (f" · {kept} token{'s' if kept != 1 else ''} kept", LABEL),
    ]
    return fit_lines([line], width)


def _settings(p: Pending, knob: str, width: int) -> list[Line]:
    """The settings of this draw, one a line (the knob the keys change marked ▸)."""
    st = p.settings
    lines: list[Pieces] = [[("Settings of this draw", HEAD), ("  (^↑/^↓ or F2 reshape the die)", LABEL)]]
    for name in KNOBS:
        lines.append(
            [
                ("▸ " if name == knob else "  ", DRAWN),
                (f"{SETTING[name].label:<12}", BOLD if name == knob else LABEL),
                (f"{fmt_value(name, getattr(st, name)):>6}", NONE),
            ]
        )
    lines.append([(f"  seed {fmt_value('seed', st.seed)} · context {p.n_past} tokens", LABEL)])
    return fit_lines(lines, width)


def _settings_short(st: SamplingSettings, knob: str, width: int) -> list[Line]:
    """The settings on one line (the knob the keys change marked ▸), or as few as the
    width allows: a setting is not split between two."""
    out: list[Line] = []
    short: Pieces = []
    for name in KNOBS:
        item: Pieces = [
            ("▸" if name == knob else "", DRAWN),
            (SETTING[name].label + " ", BOLD if name == knob else LABEL),
            (fmt_value(name, getattr(st, name)) + "  ", NONE),
        ]
        if short and width_of(short) + width_of(item) > width:
            fit_line(short, width, out)
            short = []
        short += item
    fit_line(short + [("(^↑/^↓ F2)", LABEL)], width, out)
    return out


def pending_lines(v: PanelView, width: int) -> list[Line]:
    """Step mode: the die of the pending draw, fitted to the panel's height (see the
    module's docstring for what gives way first)."""
    p = v.pending
    assert p is not None
    drawn = last_draw(v)
    n = len(p.raw_top)
    blank = Section([BLANK], (Form(BLANKS, ()),), name="blank")
    sections = [
        Section(fit_lines([[(f"Stopped before the draw of token {p.index + 1}", HEAD)]], width), name="head"),
        Section(
            fit_lines([[(STOPPED_KEYS.format(f12=key_here("f12")), PENDING)]], width),
            (Form(KEYS, ()), Form(SETTINGS, FULL), Form(KEYS_AGAIN, ())),
            name="keys",
        ),
        Section(fit_lines([drawn], width) if drawn else [], (Form(LAST_DRAW, ()),), name="last draw"),
        blank,
        Section(_table(p, width, n), (Form(CANDIDATES, lambda over: _table(p, width, max(3, n - over))),), "rows"),
        blank,
        Section(_entropy(p, width), (Form(ENTROPY, ()),), name="entropy"),
        blank,
        # the sampler stage by stage, reshaped with the die (one line when the blanks go,
        # none with the key list: the settings in full outrank it)
        Section(waterfall_lines(p, width), (Form(BLANKS, waterfall_short(p, width)), Form(KEYS, ())), name="waterfall"),
        Section([BLANK] if p.stages else [], (Form(BLANKS, ()),), name="blank"),
        Section(
            _settings(p, v.knob, width),
            (Form(SETTINGS, lambda over: _settings_short(p.settings, v.knob, width)),),
            name="settings",
        ),
    ]
    return fit(sections, v.height)
