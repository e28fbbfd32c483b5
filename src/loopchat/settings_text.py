"""The sampling settings in words, for the screen: made from the rows of settings.SETTINGS
(their spoken names, knob steps and summary items), so a new row shows up everywhere
without another list of names. Used by the F1 help, the loop panel and the branch picker.
"""

from __future__ import annotations

from loopchat.settings import KNOBS, SETTING, SETTINGS, SamplingSettings, fmt_limit, fmt_value


def knob_steps_text() -> str:
    """What Ctrl+Up/Down does to each knob: "temperature ±0.1, top-p ±0.05, ..."."""
    return ", ".join(f"{SETTING[name].spoken} ±{fmt_limit(SETTING[name].knob_step or 0)}" for name in KNOBS)


def knob_order_text() -> str:
    """The order F8 selects the knobs in: "temperature → top-p → top-k → min-p"."""
    return " → ".join(SETTING[name].spoken for name in KNOBS)


def knobs_line(settings: SamplingSettings) -> str:
    """The knobs' values in running text: "T 0.70, top-p 0.95, top-k 40, min-p 0.05"."""
    return ", ".join(f"{SETTING[name].symbol} {fmt_value(name, getattr(settings, name))}" for name in KNOBS)


def summary_lines(settings: SamplingSettings, width: int) -> list[str]:
    """The panel's line under the knobs' rows: every row's summary item, in the table's
    order ("  repeat ×1.10 over 64 · seed 7 · max 512"); when that is wider than `width`,
    two lines, the items that wrap (the seed, DRY, the draft) on the second, and on a third
    where the second would be wider than `width` (an item is never cut in two)."""
    items = [(spec.wraps, text) for spec in SETTINGS if spec.summary is not None and (text := spec.summary(settings))]
    one = "  " + " · ".join(text for _, text in items)
    if len(one) <= width:
        return [one]
    lines, line = ["  " + " · ".join(text for wraps, text in items if not wraps)], ""
    for text in (text for wraps, text in items if wraps):
        if line and len(f"  {line} · {text}") > width:
            lines.append("  " + line)
            line = text
        else:
            line = f"{line} · {text}" if line else text
    return [*lines, "  " + line]
