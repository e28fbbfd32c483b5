"""Shift+F7: the transcript's tokens coloured by their lens depth (chat/lens_depth.py).

The depths of a reply are read when asked: the shown reply's when the mode is turned on,
then each reply that finishes while it is on (between replies only: a message sent
meanwhile stops the reading, chat/session_core.py). Once a frame, depths that came are
drawn (the reply's view rebuilt, the legend's progress updated).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from loopchat.chat.conversation import ReplyRecord
from loopchat.chat.prefs import Prefs
from loopchat.tui.token_styles import legend_text, lens_legend_text


def legend_for(prefs: Prefs, probe: Any, rec: ReplyRecord | None) -> Text | None:
    """The legend above the transcript for the colouring on (None: no colouring)."""
    if prefs.lens_colours:
        layers = probe.rec.lens_layers if probe is not None else rec.lens_layers if rec is not None else 0
        return lens_legend_text(layers, probe.status if probe is not None else "")
    return legend_text() if prefs.prob_colours else None


def depth_frame(app: Any) -> None:
    """Draw the depths that came; between replies, ask for the last reply's if not yet."""
    probe = app.depth_probe
    if probe is not None and probe.changed:
        probe.changed = False
        view = app.replies.get(probe.rec)
        if view is not None:
            view.rebuild()
        app.show_legend()
    if app.prefs.lens_colours and not app.generating and (probe is None or probe.done):
        rec = app.session.last_done_reply()
        if rec is not None and rec.number not in app.depth_asked:
            app.depth_asked.add(rec.number)
            app.read_lens_depths(None, quiet=True)
