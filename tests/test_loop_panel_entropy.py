"""The loop panel's surprisal and entropy rows under the pass times (issue 13 item 6):
values computed from the steps of a recorded trace (raw softmax, bits), the pass of the
most surprising token, gaps for steps whose figures are not given, a selected past token's
passes, and an index built step by step that stays as small as the panel is wide."""

from __future__ import annotations

import dataclasses
import math

from rich.console import Console
from test_panel_threads import record, text

from loopchat.chat.plots import sparkline
from loopchat.tui.loop_panel import PanelView, panel_renderable
from loopchat.tui.panel_caches import _SPARK_BLOCKS, PanelCaches, ReplyIndex, Series


def row(panel: str, label: str) -> str:
    lines = [ln for ln in panel.splitlines() if ln.startswith(f"{label:<12}")]
    assert len(lines) == 1, (label, panel)
    return lines[0][12:].rstrip()


def wide(r, step, pinned: bool = False) -> str:
    """The panel 160 cells wide: a sparkline cell per step (130 cells for 40 steps)."""
    view = PanelView(record=r, step=step, live=step.settings, pinned=pinned, width=160)
    console = Console(width=160, record=True, color_system=None, file=open("/dev/null", "w"))
    console.print(panel_renderable(view))
    return console.export_text()


def test_the_rows_show_the_surprisal_and_entropy_of_the_steps() -> None:
    r = record(threads=False)
    bits = [-math.log2(s.raw_prob) for s in r.steps]
    ent = [s.raw_entropy for s in r.steps]
    panel = text(r, r.steps[-1], pinned=False)
    # the trace's figures: the least surprising token ~0.0002 bits, the most " Fire" at pass 21
    assert row(panel, "surprisal").endswith("  0.00–6.24 bits")
    assert f"{max(bits):.2f}" == "6.24" and bits.index(max(bits)) == 20 and r.steps[20].piece == " Fire"
    assert row(panel, "entropy").endswith(f"  {min(ent):.2f}–{max(ent):.2f} bits") and f"{max(ent):.2f}" == "6.22"
    assert "raw softmax · max surprisal: pass 21" in panel
    # one cell per step at this width: the tallest cell is the step of the max, the lowest the min
    spark = wide(r, r.steps[-1])
    cells = row(spark, "surprisal").split("  ")[0]
    assert len(cells) == len(r.steps)
    assert cells[20] == "█" and cells.index("█") == 20 and cells[bits.index(min(bits))] == "▁"
    assert cells == sparkline(bits, 200)
    assert row(spark, "entropy").split("  ")[0] == sparkline(ent, 200)


def test_a_selected_token_shows_the_passes_up_to_it() -> None:
    r = record(threads=False)
    bits = [-math.log2(s.raw_prob) for s in r.steps[:13]]
    panel = text(r, r.steps[12], pinned=True)
    assert row(panel, "surprisal").endswith(f"  {min(bits):.2f}–{max(bits):.2f} bits")
    assert f"max surprisal: pass {bits.index(max(bits)) + 1}" in panel
    assert len(row(wide(r, r.steps[12], pinned=True), "surprisal").split("  ")[0]) == 13


def test_steps_without_figures_are_gaps_never_invented() -> None:
    r = record(threads=False)
    # the server gave no logprobs for passes 21-23 (the most surprising token among them)
    r.steps = [dataclasses.replace(s, raw_prob=None, raw_entropy=None) if 20 <= s.index <= 22 else s for s in r.steps]
    given = [-math.log2(s.raw_prob) for s in r.steps if s.raw_prob is not None]
    panel = wide(r, r.steps[-1])
    cells = row(panel, "surprisal")[: len(r.steps)]
    assert (
        row(panel, "surprisal")[len(r.steps) :].startswith("  0")
        and cells[20:23] == "   "
        and " " not in cells[:20] + cells[23:]
    )
    assert row(panel, "surprisal").endswith(f"  {min(given):.2f}–{max(given):.2f} bits")
    assert f"{max(given):.2f}" != "6.24"  # the missing pass's value is nowhere
    # nothing given at all (a server without logprobs): said so, no sparkline, no max
    r.steps = [dataclasses.replace(s, raw_prob=None, raw_entropy=None) for s in r.steps]
    panel = text(r, r.steps[-1], pinned=False)
    assert row(panel, "surprisal") == "not given" and row(panel, "entropy") == "not given"
    assert "max surprisal" not in panel


def test_the_index_grows_with_the_new_steps_and_stays_small() -> None:
    r = record(threads=False)
    full = r.steps
    caches = PanelCaches()
    for n in range(1, len(full) + 1):  # a reply arriving step by step, one frame each
        r.steps = full[:n]
        text(r, r.steps[-1], pinned=False, caches=caches)
    index = caches.index
    once = ReplyIndex(r)
    once.update()
    assert index is not None and index.seen == len(full)
    for name in ("surprisal", "entropy", "latency"):
        a, b = getattr(index, name), getattr(once, name)
        assert (a.values, a.blocks, a.lo, a.hi, a.peak) == (b.values, b.blocks, b.lo, b.hi, b.peak), name
    # a long reply: the sparkline is drawn from at most 2 x _SPARK_BLOCKS block maxima
    s = Series()
    for i in range(10_000):
        s.add(None if i % 7 == 0 else float(i % 100 + i // 1000))
        # the sparkline kept from frame to frame is the one its blocks draw now
        assert s.spark(18) == sparkline(s.blocks, 18), i
    assert len(s.blocks) <= 2 * _SPARK_BLOCKS and s.hi == 108.0 and s.peak == 9099 and s.lo == 0.0
    assert max(b for b in s.blocks if b is not None) == 108.0


def test_a_probability_of_zero_is_infinite_surprise() -> None:
    r = record(threads=False)
    r.steps = [dataclasses.replace(s, raw_prob=0.0) if s.index == 5 else s for s in r.steps]
    panel = wide(r, r.steps[-1])
    assert row(panel, "surprisal").endswith("–∞ bits") and "max surprisal: pass 6" in panel
    assert row(panel, "surprisal")[5] == "█"


def test_the_peak_caption_stays_on_one_line_in_a_narrow_panel() -> None:
    """A narrow panel (at 120 columns its text is 48 cells wide): the long caption would
    put its pass number on a line of its own; the short one says the same on one line."""
    r = record(threads=False)

    def at(width: int) -> str:
        view = PanelView(record=r, step=r.steps[-1], live=r.steps[-1].settings, width=width)
        console = Console(width=width, record=True, color_system=None, file=open("/dev/null", "w"))
        console.print(panel_renderable(view))
        return console.export_text()

    assert "raw softmax · max surprisal: pass 21" in at(60)
    (line,) = [ln for ln in at(46).splitlines() if "max surprisal" in ln]
    assert line.strip() == "raw · max surprisal: pass 21"
