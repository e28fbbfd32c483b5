"""The app's partial repaints (RowCroppingCompositor) keep the terminal identical to a
full render of the screen, frame after frame, while a reply streams and scrolls."""

from __future__ import annotations

from typing import Any

import pytest
from rich.cells import cell_len
from textual._compositor import ChopsUpdate, LayoutUpdate
from textual.strip import Strip
from tui_fixtures import FakeBackend, wait_run

from loopchat.chat.prefs import Prefs
from loopchat.tui.app import LoopChatApp
from loopchat.tui.render.compositor import RowCroppingCompositor

Cell = tuple[str, Any]


def _cells(strips: list[Strip] | Any) -> list[Cell]:
    out: list[Cell] = []
    for strip in strips:
        for seg in strip:
            for ch in seg.text:
                out.append((ch, seg.style))
                out.extend(("", seg.style) for _ in range(cell_len(ch) - 1))
    return out


class Terminal:
    """A screen buffer that takes the compositor's updates as a terminal would, and
    compares itself with a fresh full render after each one."""

    def __init__(self, compositor: Any) -> None:
        self.compositor = compositor
        self.rows: list[list[Cell]] = [_cells([s]) for s in compositor.render_strips()]
        self.partial_updates = 0
        self.final: list[int] = []
        self.mismatches: list[str] = []
        self.suspects: set[int] = set()
        original = compositor.render_update

        def render_update(*args: Any, **kwargs: Any) -> Any:
            update = original(*args, **kwargs)
            self.apply(update)
            return update

        compositor.render_update = render_update

    def apply(self, update: Any) -> None:
        if isinstance(update, LayoutUpdate):
            self.rows = [_cells(line) for line in update.strips]
        elif isinstance(update, ChopsUpdate):
            self.partial_updates += 1
            for y, x1, x2 in update.spans:
                row = self.rows[y]
                for end, (x, strip) in zip(update.chop_ends[y], update.chops[y].items()):
                    if strip is None or x >= x2 or end <= x1:
                        continue
                    for i, cell in enumerate(_cells([strip])):
                        if x1 <= x + i < x2:
                            row[x + i] = cell
        else:
            return
        # A row may differ from a full render for one update: Textual can change a
        # widget (a scroll, say) between the moment it collects a frame's dirty regions
        # and the moment it renders them, and repaints it in the next update. A row that
        # still differs one update later was missed.
        truth = [_cells([s]) for s in self.compositor.render_strips()]
        bad = {y for y, (shown, want) in enumerate(zip(self.rows, truth)) if shown != want}
        for y in sorted(bad & self.suspects):
            text = "".join(c for c, _ in self.rows[y])
            self.mismatches.append(f"row {y} after update {self.partial_updates}: {text!r}")
        self.suspects = bad

    def settled(self) -> list[int]:
        """Rows that differ from a full render when nothing is left to repaint."""
        truth = [_cells([s]) for s in self.compositor.render_strips()]
        return [y for y, (shown, want) in enumerate(zip(self.rows, truth)) if shown != want]


async def _stream_and_check(size: tuple[int, int], tmp_path: Any) -> Terminal:
    words = [f" word{i}" if i % 7 else f"\nline {i}:" for i in range(400)]
    app = LoopChatApp(
        FakeBackend(tokens=words, delay=0.002), prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json"
    )
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        term = Terminal(app.screen._compositor)
        await pilot.press(*"go", "enter")
        await pilot.press("ctrl+up", "ctrl+up")  # a settings change mid-reply
        await wait_run(pilot)
        await pilot.press("alt+left", "alt+left")  # select a past token: the panel redraws
        await pilot.pause()
        await pilot.pause()
        term.final = term.settled()
        return term


@pytest.mark.slow
@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_partial_repaints_match_a_full_render(size, tmp_path) -> None:
    term = await _stream_and_check(size, tmp_path)
    assert isinstance(term.compositor, RowCroppingCompositor)
    assert term.partial_updates > 20  # the reply really streamed over many frames
    assert term.mismatches == []
    assert term.final == []


@pytest.mark.slow
async def test_the_check_catches_a_compositor_that_misses_lines(tmp_path, monkeypatch) -> None:
    """The same check fails for a compositor that drops the last dirty region."""
    original = RowCroppingCompositor.render_partial_update

    def lossy(self: RowCroppingCompositor) -> Any:
        if len(self._dirty_regions) > 1:
            self._dirty_regions.pop()
        return original(self)

    monkeypatch.setattr(RowCroppingCompositor, "render_partial_update", lossy)
    term = await _stream_and_check((120, 40), tmp_path)
    assert term.mismatches
    assert term.partial_updates > 20
