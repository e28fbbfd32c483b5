"""How a reply's token looks in the transcript: its probability colour (F7) or its lens
depth's (Shift+F7), a token a constraint forced (Ctrl+F7), the token boundaries (F6: by
token, or by the forward pass that gave it, a draft's tokens kept on green), the selection, a token picked by hand (underlined), and a token at which the reply repeats
itself (Step.repeat, repeats.py: a dark plum background)."""

from __future__ import annotations

from functools import lru_cache

from rich.style import Style
from rich.text import Text

from loopchat.chat.pass_stats import same_pass
from loopchat.chat.prefs import Prefs
from loopchat.events import Step

#: (lowest probability, colour) from most to least likely: the probability a token was
#: drawn with, in the distribution after the sampling settings.
PROB_BANDS: tuple[tuple[float, str], ...] = (
    (0.9, "#5fd75f"),
    (0.6, "#afd75f"),
    (0.3, "#ffd75f"),
    (0.1, "#ff8700"),
    (0.0, "#ff5f5f"),
)
BOUNDARY_BG = ("#2b3340", "#3a4456")
#: F6 by pass: a token the draft guessed and the pass kept (Step.drafted), on the pass's shade of green
KEPT_BG = ("#1f3a2a", "#3d7a52")  # (256 colours: 22, 65; the boundaries 23, 59)
#: a token a constraint forced (the panel's "forced" mark: chat/views/panel_constraint.FORCED)
FORCED_COLOUR = "#87afff"
#: the background of a token at which the reply is repeating itself (over the boundaries')
REPEAT_BG = "#5f2f5f"


def prob_colour(p: float) -> str:
    for lo, colour in PROB_BANDS:
        if p >= lo:
            return colour
    return PROB_BANDS[-1][1]


#: the lens depth's colours (chat/lens_depth.py), from the first layers to the last: the
#: depth's share of the layers before the last, in quarters; then the last layer alone,
#: and a token the last layer does not rank first
DEPTH_BANDS: tuple[str, ...] = ("#5fd7ff", "#5fafff", "#af87ff", "#d75fd7", "#ff5f87")
NOT_TOP = "#808080"


def depth_colour(depth: int | None, layers: int) -> str:
    """The colour of a token whose lens depth is `depth` in a model of `layers` layers."""
    if depth is None:
        return NOT_TOP
    if depth >= layers - 1:
        return DEPTH_BANDS[-1]
    return DEPTH_BANDS[min(3, 4 * depth // max(1, layers - 1))]


def depth_bands(layers: int) -> list[tuple[str, str]]:
    """(label, colour) of each band: the layers it covers."""
    out = []
    for q in range(4):
        lo, hi = -(-q * (layers - 1) // 4), -(-(q + 1) * (layers - 1) // 4) - 1
        if lo <= hi:
            out.append((f"{lo}–{hi}" if hi > lo else f"{lo}", DEPTH_BANDS[q]))
    out.append((f"{layers - 1} last", DEPTH_BANDS[-1]))
    return out


def lens_legend_text(layers: int, status: str) -> Text:
    """The lens depth's legend: the progress of a reading first (it is cut last), then the bands."""
    t = Text(no_wrap=True, overflow="ellipsis")
    if status:
        t.append(status + " · ", style="dim")
    t.append("top from layer ", style="dim")
    for label, colour in depth_bands(layers) if layers else []:
        t.append("■" + label + " ", style=colour)
    t.append("■not top", style=NOT_TOP)
    return t


def legend_text() -> Text:
    t = Text("p when drawn: ", style="dim", no_wrap=True, overflow="ellipsis")
    labels = ("≥90%", "60–90", "30–60", "10–30", "<10%")
    for (_, colour), label in zip(PROB_BANDS, labels):
        t.append("■" + label + " ", style=colour)
    return t


def token_style(step: Step, n: int, prefs: Prefs, selected: bool, lens: str | None = None) -> Style | None:
    """`n`: the token's place among those shown (F6 by pass: its pass's, `PassParity`);
    `lens`: the token's lens depth colour (when that mode is on and its depth is known)."""
    # a remote server that does not say what it sampled from: no colour (not given)
    p = step.sampled_prob
    return _token_style(
        lens if lens is not None else prob_colour(p) if prefs.prob_colours and p is not None else None,
        n % 2 if prefs.token_boundaries or prefs.token_passes else None,
        selected,
        step.chosen_by == "hand",
        step.repeat is not None,
        prefs.forced_marks and step.constraint is not None and step.constraint.forced,
        prefs.token_passes and bool(step.drafted),
    )


class PassParity:
    """F6 by pass: the shade of each shown token's pass, 0 and 1 in turn from one pass to
    the next (a plain pass gave one token; a verifying pass's tokens share its shade)."""

    def __init__(self) -> None:
        self.prev: Step | None = None
        self.shade = 1

    def of(self, step: Step) -> int:
        if not same_pass(self.prev, step):
            self.shade ^= 1
        self.prev = step
        return self.shade


@lru_cache(maxsize=64)  # a few dozen combinations, each an immutable Style
def _token_style(
    colour: str | None,
    parity: int | None,
    selected: bool,
    hand: bool = False,
    repeat: bool = False,
    forced: bool = False,
    kept: bool = False,
) -> Style:
    """A token's style; a token picked by hand in step mode is underlined, a token at
    which the reply repeats itself has REPEAT_BG behind it, a token a constraint forced
    (forced marks on, Ctrl+F7) is FORCED_COLOUR in italics, over its probability colour; F6
    by pass: a drafted token the pass kept is on KEPT_BG."""
    if selected:
        return Style(color="black", bgcolor="#ffaf00", bold=True, underline=hand or None)
    bg = REPEAT_BG if repeat else (KEPT_BG if kept else BOUNDARY_BG)[parity] if parity is not None else None
    if forced:
        return Style(color=FORCED_COLOUR, bgcolor=bg, italic=True, underline=hand or None)
    return Style(color=colour, bgcolor=bg, underline=hand or None)
