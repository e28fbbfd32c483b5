"""The logit lens as text (`loopchat run --lens`): a pass's rows, one per layer
(events.LensRow; engine/lens.py computes them, docs/trace-format.md defines them)."""

from __future__ import annotations

from loopchat.events import Step

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(probs: list[float]) -> str:
    """The drawn token's probability from the first layer to the last, a bar each (0 to 1)."""
    return "".join(_BARS[min(len(_BARS) - 1, int(p * len(_BARS)))] for p in probs)


def lens_lines(step: Step) -> list[str]:
    """A pass's lens: a title with the sparkline, then a row per layer."""
    rows = step.lens or ()
    if not rows:
        return []
    out = [f"lens of pass {step.index} (drew {step.piece!r}): {sparkline([r.drawn_prob for r in rows])}"]
    for r in rows:
        out.append(
            f"  layer {r.layer:3d}  top {r.top_text!r:<14} {r.top_prob:6.3f}  drawn rank {r.drawn_rank:6d} "
            f"p {r.drawn_prob:.3g}  entropy {r.entropy:5.2f} bits"
        )
    return out
