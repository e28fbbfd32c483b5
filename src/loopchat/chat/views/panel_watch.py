"""The loop panel's "Watching" rows (issue 24, item 4; watch.py): at the pass shown, each
token on watch with its raw probability and rank, then the sampled ones ("cut": the
settings removed it), and a sparkline of its raw probability over the reply's last
passes up to this one (log scale, 1e-6 to 1: a bar a pass)."""

from __future__ import annotations

import math

from loopchat.chat.plots import fmt_prob, show_token
from loopchat.chat.views.lines import Pieces
from loopchat.chat.views.panel_view import DIM, DRAWN, HEAD, LABEL, NONE, PanelView

_BARS = " ▁▂▃▄▅▆▇█"
#: the sparkline's floor: a probability at or below it is an empty cell
FLOOR = 1e-6


def spark_bar(p: float) -> str:
    """One pass's bar: log10(p) from log10(FLOOR) (empty) to 0 (full)."""
    if p <= FLOOR:
        return _BARS[0]
    x = (math.log10(p) - math.log10(FLOOR)) / -math.log10(FLOOR)
    return _BARS[max(1, min(len(_BARS) - 1, math.ceil(x * (len(_BARS) - 1))))]


def watch_lines(v: PanelView, spark: int = 16) -> list[Pieces]:
    """The rows for the step shown (none when nothing is on watch); `spark`: passes in a
    sparkline (0: none)."""
    r, s = v.record, v.step
    if r is None or s is None or not s.watched or r.start is None or not r.start.watch:
        return []
    pos = s.index if s.index < len(r.steps) and r.steps[s.index] is s else r.steps.index(s)
    recent = [st.watched for st in r.steps[max(0, pos - spark + 1) : pos + 1] if st.watched] if spark else []
    out: list[Pieces] = [[("Watching", HEAD), (" raw → after sampling", LABEL)]]
    for k, ((text, _), w) in enumerate(zip(r.start.watch, s.watched)):
        sampled = f"{fmt_prob(w.sampled_prob)} #{w.sampled_rank}" if w.sampled_rank else "cut"
        line: Pieces = [
            (f"{show_token(text):<10} ", DRAWN if w.token_id == s.token_id else NONE),
            (f"{fmt_prob(w.raw_prob)} #{w.raw_rank} → {sampled}", NONE),
        ]
        if recent:
            line.append(("  " + "".join(spark_bar(ws[k].raw_prob) for ws in recent), DIM))
        out.append(line)
    return out
