"""The logit lens screen's lines (tui/lens_screen.py draws them): a pass's rows, one per
layer (events.LensRow, engine/lens.py), with a sparkline of the drawn token's probability
from the first layer to the last."""

from __future__ import annotations

from rich.style import Style

from loopchat.chat.conversation import ReplyRecord
from loopchat.chat.views.lines import Line
from loopchat.events import LensRow
from loopchat.lens_lines import sparkline

HEAD = Style.parse("bold #87d7ff")
LABEL = Style.parse("#8a8a8a")
FIGURE = Style.parse("#d0d0d0")
TOP = Style.parse("bold #ffaf5f")
DRAWN = Style.parse("bold #87d7af")


def lens_lines(
    rec: ReplyRecord | None, step: int, rows: tuple[LensRow, ...] | None, note: str | None, done: bool
) -> list[Line]:
    """The screen's lines for reply `rec`'s step `step`."""
    st = None if rec is None else next((s for s in rec.steps if s.index == step), None)
    drew = repr(st.piece) if st is not None else "?"
    out: list[Line] = [
        ((f"Logit lens · reply {rec.number if rec else '?'}, pass {step + 1}", HEAD), (f" · drew {drew}", DRAWN)),
        (("each layer's output through the model's final norm and head (Esc: back)", LABEL),),
    ]
    if not done:
        return [*out, (("computing…", LABEL),)]
    if not rows:
        return [*out, ((note or "no lens rows came back", LABEL),)]
    out.append(
        (("drawn token's probability, first layer → last: ", LABEL), (sparkline([r.drawn_prob for r in rows]), DRAWN))
    )
    out.append((("layer  top token            p       drawn rank       p   entropy", LABEL),))
    for r in rows:
        out.append(
            (
                (f"{r.layer:5d}  ", LABEL),
                (f"{r.top_text!r:<18}", TOP),
                (f"{r.top_prob:6.3f}   ", FIGURE),
                (f"{r.drawn_rank:10d} {r.drawn_prob:9.3g}", DRAWN if r.drawn_rank == 1 else FIGURE),
                (f"  {r.entropy:5.2f} bits", FIGURE),
            )
        )
    return out
