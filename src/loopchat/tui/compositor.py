"""A screen whose partial repaints cost the lines that changed, not the whole screen.

Textual's compositor (8.x) repaints a frame's dirty regions by taking the one box that
surrounds all of them and rendering every widget that box touches over that widget's
whole visible height. In this app a frame dirties a few lines at the bottom of the
transcript (left) and a few lines of the loop panel (right): the surrounding box is then
nearly the whole screen, and every frame re-rendered the full transcript, the panel and
their containers (measured: 8 ms of the UI's ~10 ms a frame on a 2-core EPYC, median
dirty box 3,978 of 4,800 cells at 120x40).

`RowCroppingCompositor` renders each group of dirty regions on its own, asks each widget
only for the dirty rows inside it, and skips a widget whose pieces there are all painted
already by widgets in front of it (the containers behind the transcript and the panel).
Rows are cropped, never columns, so every piece still starts and ends on one of the
compositor's cuts (the edges of widgets), which is what `ChopsUpdate` expects; a full
update goes through Textual's own path unchanged.
`tests/test_compositor.py` replays every update on a cell buffer and checks it against
the compositor's full render, cell for cell.

This replaces `render_partial_update` of `textual._compositor.Compositor` and uses its
private `cuts`, `visible_widgets`, `_dirty_regions` and `_regions_to_spans`: pyproject.toml pins Textual to
8.2.x for that, and tests/test_compositor.py fails if a release changes them.
"""

from __future__ import annotations

from textual._compositor import ChopsUpdate, Compositor
from textual.geometry import Region
from textual.screen import Screen
from textual.strip import Strip


class RowCroppingCompositor(Compositor):
    def render_partial_update(self) -> ChopsUpdate | None:
        update_regions = self._dirty_regions.copy()
        self._dirty_regions.clear()
        screen_region = self.size.region
        # one box per column span: a widget's dirty lines share its x and width
        boxes: dict[tuple[int, int], Region] = {}
        for region in update_regions:
            region = region.intersection(screen_region)
            if region:
                key = (region.x, region.width)
                boxes[key] = boxes[key].union(region) if key in boxes else region
        if not boxes:
            return None
        spans = list(self._regions_to_spans(update_regions))
        rows = {y for y, _, _ in spans}
        cuts = self.cuts
        chops: list[dict[int, Strip | None]] = [dict.fromkeys(cut_set[:-1]) for cut_set in cuts]
        for box in boxes.values():
            self._render_rows(box, rows, chops)
        return ChopsUpdate(chops, spans, [cut_set[1:] for cut_set in cuts])

    def _render_rows(self, box: Region, rows: set[int], chops: list[dict[int, Strip | None]]) -> None:
        """Fill the empty chops of `box` (those that overlap its columns, on its rows in
        `rows`), front widget first, asking each widget for those rows only. A widget
        whose chops there are all filled already (a container behind its children) is
        not rendered at all; chops outside the box are left to the box they belong to."""
        cuts = self.cuts
        top, left, right = box.y, box.x, box.right
        # per dirty row of the box: the chops (by starting cut) that overlap its columns
        box_chops = {
            y: [cut for cut, end in zip(cuts[y], cuts[y][1:]) if cut < right and end > left]
            for y in range(top, box.bottom)
            if y in rows
        }
        for widget, (region, clip) in self.visible_widgets.items():
            y1 = max(clip.y, top)
            y2 = min(clip.bottom, box.bottom)
            if y2 <= y1:
                continue
            x, y, width, height = region.intersection(Region(clip.x, y1, clip.width, y2 - y1))
            x2 = x + width
            if not (width and height) or x >= right or x2 <= left:
                continue
            wanted = [
                line_y
                for line_y in range(y, y + height)
                if line_y in box_chops
                and any(x <= cut < x2 and chops[line_y][cut] is None for cut in box_chops[line_y])
            ]
            if not wanted:
                continue
            y, height = wanted[0], wanted[-1] - wanted[0] + 1
            strips = widget.render_lines(Region(x - region.x, y - region.y, width, height))
            for line_y, strip in zip(range(y, y + height), strips):
                targets = box_chops.get(line_y)
                if not targets:
                    continue
                line = chops[line_y]
                final_cuts = [cut for cut in cuts[line_y] if x2 >= cut >= x]
                for cut, piece in zip(final_cuts, strip.divide([cut - x for cut in final_cuts[1:]])):
                    if cut in targets and line[cut] is None:
                        line[cut] = piece


class LoopScreen(Screen):
    """The app's main screen, painted by `RowCroppingCompositor`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._compositor = RowCroppingCompositor()
