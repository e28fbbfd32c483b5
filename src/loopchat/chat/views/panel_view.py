"""What the loop panel is asked to show (`PanelView`: the reply, the step, the live
settings, the panel's size and mode) and the styles its sections share."""

from __future__ import annotations

from dataclasses import dataclass

from rich.style import Style

from loopchat.chat.conversation import ReplyRecord
from loopchat.events import Pending, Step
from loopchat.settings import SamplingSettings

HEAD = Style.parse("bold #87d7ff")
LABEL = Style.parse("#8a8a8a")
DRAWN = Style.parse("bold #ffaf00")
CHANGED = Style.parse("bold #ff87d7")
GENERATING = Style.parse("#5fd75f")
BLOCKING_NOTE = Style.parse("italic #87afd7")
TOKEN = Style.parse("#d0d0d0")
RAW_BAR = Style.parse("#5f87af")
SAMPLED_BAR = Style.parse("#5faf5f")
SPARK = Style.parse("#5fafd7")
UNSURE = Style.parse("#d7af5f")
PENDING = Style.parse("#ffd75f")
WELCOME = Style.parse("#bcbcbc")
DIM = Style.parse("dim")
BOLD = Style.parse("bold")
NONE = Style()


@dataclass
class PanelView:
    record: ReplyRecord | None
    step: Step | None
    live: SamplingSettings  # what the next step will use
    knob: str = "temperature"
    pinned: bool = False  # a past token selected by the user
    generating: bool = False
    compact: bool = False
    width: int = 48
    height: int = 0  # lines the panel has (0: as many as it needs)
    model: str = ""
    takes_messages: bool = True  # False for a replayed trace: there is no next reply
    #: step mode: the die of the draw the loop is stopped before (shown unless a token is pinned)
    pending: Pending | None = None


def remote(v: PanelView) -> str:
    """The server that generated the reply shown ("" for this machine's engine)."""
    r = v.record
    return r.start.source if r is not None and r.start is not None else ""


def view_key(v: PanelView) -> tuple:
    """Everything the panel shows depends on; equal keys draw the same panel."""
    r, s = v.record, v.step
    if r is None:
        rk: tuple = ()
    else:
        rk = (r, r.mode, r.number, len(r.steps), r.prefill, r.finish, r.start is not None)
    return (rk, s, v.live, v.knob, v.pinned, v.generating, v.compact, v.width, v.height, v.model, v.pending)
