"""The loop panel's `threads` row: the count of the pass shown and auto's reason for its
last change, live and on a selected past token; "pinned" for a fixed count; no row for a
trace recorded before threads were (the bundled snapshot trace)."""

from __future__ import annotations

import dataclasses

from rich.console import Console
from tui_fixtures import REPLY_TRACE

from loopchat.chat.conversation import STREAM, ReplyRecord
from loopchat.events import Finish, Prefill, Start, Step
from loopchat.trace import read_trace
from loopchat.tui.loop_panel import PanelView, panel_renderable
from loopchat.tui.panel_caches import PanelCaches

PROBE = "probing 1 thread (first measurement)"
KEPT = "kept 2 threads: 10.0 ms/pass vs 1: 17.0 ms (regular re-check)"


def record(auto: bool = True, threads: bool = True) -> ReplyRecord:
    _, traced = read_trace(REPLY_TRACE)
    events = [t.event for t in traced]
    start = next(e for e in events if isinstance(e, Start))
    steps = [e for e in events if isinstance(e, Step)]
    assert len(steps) >= 12
    if threads:
        # passes 6-9 ran with 1 thread (a probe), the others with 2
        def count(i: int) -> int:
            return 1 if 5 <= i <= 8 else 2

        notes = {0: "2 threads (the physical cores) until measured", 5: PROBE, 9: KEPT} if auto else {}
        steps = [dataclasses.replace(s, threads=count(s.index), threads_reason=notes.get(s.index, "")) for s in steps]
    r = ReplyRecord(1, STREAM, start.messages)
    r.start = dataclasses.replace(start, threads_auto=auto)
    r.prefill = next(e for e in events if isinstance(e, Prefill))
    r.steps = steps
    r.finish = next(e for e in events if isinstance(e, Finish))
    return r


def text(r: ReplyRecord, step: Step, pinned: bool, caches: PanelCaches | None = None) -> str:
    view = PanelView(record=r, step=step, live=step.settings, pinned=pinned, width=120)
    console = Console(width=120, record=True, color_system=None, file=open("/dev/null", "w"))
    console.print(panel_renderable(view) if caches is None else _lines(view, caches))
    return console.export_text()


def _lines(view: PanelView, caches: PanelCaches):
    from loopchat.tui.fast_static import lines_to_text
    from loopchat.tui.loop_panel import panel_lines

    return lines_to_text(panel_lines(view, caches))


def test_a_pass_of_many_tokens_says_so_beside_its_count() -> None:
    """A batched pass (or a prefill's) may run at more threads than single passes chose
    (docs/models.md, "threads"): its row says it is a pass of many tokens."""
    from loopchat.batch import BatchPass

    r = record()
    batched = dataclasses.replace(r.steps[10], batch=BatchPass(3, 4, 20.0, 10.0), forward_tokens=4)
    assert f"threads     2 auto (a pass of many tokens) · {KEPT}, pass 10" in text(r, batched, pinned=True)
    assert "threads     2 auto · " in text(r, r.steps[10], pinned=True)


def test_the_last_change_and_its_reason() -> None:
    r = record()
    last = text(r, r.steps[-1], pinned=False)
    assert f"threads     2 auto · {KEPT}, pass 10" in last
    # a selected token during the probe: its count, and the reason in force then
    assert f"threads     1 auto · {PROBE}, pass 6" in text(r, r.steps[7], pinned=True)
    assert f"threads     1 auto · {PROBE}, at this pass" in text(r, r.steps[5], pinned=True)
    assert "threads     2 auto · 2 threads (the physical cores) until measured" in text(r, r.steps[2], pinned=True)


def test_the_index_is_built_once_per_step() -> None:
    r = record()
    caches = PanelCaches()
    full = r.steps
    r.steps = full[:7]
    assert f"{PROBE}, pass 6" in text(r, r.steps[-1], pinned=False, caches=caches)
    r.steps = full
    assert f"{KEPT}, pass 10" in text(r, r.steps[-1], pinned=False, caches=caches)
    assert caches.index is not None and caches.index.threads == [(0, caches.index.threads[0][1]), (5, PROBE), (9, KEPT)]


def test_pinned_and_old_traces() -> None:
    r = record(auto=False)
    assert "threads     2 pinned" in text(r, r.steps[-1], pinned=False)
    old = record(threads=False)
    assert old.steps[-1].threads == 0
    assert "threads" not in text(old, old.steps[-1], pinned=False)


def test_a_short_panel_shows_fewer_candidates_before_cutting_the_rest() -> None:
    from loopchat.tui.fast_static import lines_to_text
    from loopchat.tui.loop_panel import panel_lines

    r = record()
    step = r.steps[-1]
    full = panel_lines(PanelView(record=r, step=step, live=step.settings, width=60))
    assert "top 10" in lines_to_text(full).plain
    for height in (len(full), len(full) - 4, 29):
        lines = panel_lines(PanelView(record=r, step=step, live=step.settings, width=60, height=height))
        text = lines_to_text(lines).plain
        assert len(lines) <= height, (height, len(lines))
        # everything below the table is still there: latency, surprisal, threads, context, settings
        for part in ("threads", "surprisal", "context", "Sampling settings", "max 40"):
            assert part in text, (height, part)
    assert f"top {10 - (len(full) - 29)}" in text  # as many candidates fewer as lines missing
    lines = panel_lines(PanelView(record=r, step=step, live=step.settings, width=60, height=12))
    assert "top 3" in lines_to_text(lines).plain  # never fewer than 3 (below that, the end is cut)


def test_the_prefill_row_writes_thousands_as_the_context_row_does() -> None:
    from loopchat.events import Prefill

    r = record(threads=False)
    r.prefill = Prefill(prompt_tokens=2019, reused_tokens=1500, evaluated_tokens=519, batches=2, ms=1234.0)
    panel = text(r, r.steps[-1], pinned=False)
    assert "2,019 tokens, 1,500 reused in " in panel  # ("2019 tokens" beside "context 2,063 / 4,096")


def test_the_repeat_seed_and_max_line_breaks_between_items_not_inside_one() -> None:
    r = record(threads=False)
    s = r.steps[-1]
    live = dataclasses.replace(s.settings, seed=1172701763, max_tokens=512, repeat_penalty=1.1, repeat_last_n=64)

    def at(width: int) -> list[str]:
        view = PanelView(record=r, step=s, live=live, width=width)
        console = Console(width=width, record=True, color_system=None, file=open("/dev/null", "w"))
        console.print(panel_renderable(view))
        return [ln.strip() for ln in console.export_text().splitlines()]

    assert "repeat ×1.10 over 64 · seed 1172701763 · max 512" in at(80)
    narrow = at(48)  # the chat at 120 columns ("max" ended a line, "512" began the next)
    i = narrow.index("repeat ×1.10 over 64 · max 512")
    assert narrow[i + 1] == "seed 1172701763"


def test_a_cut_probe_pass_is_shown_on_its_step() -> None:
    r = record()
    r.steps[6] = dataclasses.replace(r.steps[6], probe_cut_ms=61.4)
    assert "threads     1 auto (a probe's pass cut at 61 ms, redone) · " in text(r, r.steps[6], pinned=True)
    assert "cut at" not in text(r, r.steps[7], pinned=True)
