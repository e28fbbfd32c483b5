"""A screen whose partial repaints cost the lines that changed, not the whole screen.

Textual's compositor (8.x) repaints a frame's dirty regions by taking the one box that
surrounds all of them and rendering every widget that box touches over that widget's
whole visible height. In this app a frame dirties a few lines at the bottom of the
transcript (left) and a few lines of the loop panel (right): the surrounding box is then
nearly the whole screen, and every frame re-rendered the full transcript, the panel and
their containers: most of the UI's time a frame (see docs/performance.md,
"Textual's drawing costs").

`RowCroppingCompositor` renders each group of dirty regions on its own, asks each widget
only for the dirty rows inside it, and skips a widget whose pieces there are all painted
already by widgets in front of it (the containers behind the transcript and the panel).
Rows are cropped, never columns, so every piece still starts and ends on one of the
compositor's cuts (the edges of widgets), which is what `ChopsUpdate` expects; a full
update goes through Textual's own path unchanged.
`tests/test_compositor.py` replays every update on a cell buffer and checks it against
the compositor's full render, cell for cell.

This replaces `render_partial_update` of `textual._compositor.Compositor` and uses its
private `cuts`, `layers_visible`, `_dirty_regions` and `_regions_to_spans`, and
`LoopScreen` swaps the screen's private `_compositor`: pyproject.toml pins Textual for
that, the app uses a stock `Screen` on any other release (`render.default_screen`), and
tests/test_compositor.py fails if a release changes them.
"""

from __future__ import annotations

from typing import Any

from textual._compositor import ChopsUpdate, Compositor
from textual.geometry import Region
from textual.screen import Screen
from textual.strip import Strip
from textual.widget import Widget


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
        `rows`). Each chop is painted by the front-most widget over it (a chop lies
        between two cuts, so no widget edge crosses it); each of those widgets is asked
        once, for the rows it paints there. Chops outside the box are left to the box
        they belong to."""
        cuts, layers = self.cuts, self.layers_visible
        left, right = box.x, box.right
        # which widget paints which chops, and on which rows
        jobs: dict[Widget, tuple[Region, Region, dict[int, list[int]]]] = {}
        for y in range(box.y, box.bottom):
            if y not in rows:
                continue
            line, row_cuts = chops[y], cuts[y]
            for cut, end in zip(row_cuts, row_cuts[1:]):
                if cut >= right or end <= left or line[cut] is not None:
                    continue
                for widget, cropped, region in layers[y]:
                    if cropped.x <= cut < cropped.right:
                        job = jobs.get(widget)
                        if job is None:
                            job = jobs[widget] = (cropped, region, {})
                        job[2].setdefault(y, []).append(cut)
                        break
        for widget, (cropped, region, wanted) in jobs.items():
            x, x2 = cropped.x, cropped.right
            y1, y2 = min(wanted), max(wanted) + 1
            strips = widget.render_lines(Region(x - region.x, y1 - region.y, x2 - x, y2 - y1))
            for y, strip in zip(range(y1, y2), strips):
                targets = wanted.get(y)
                if not targets:
                    continue
                line = chops[y]
                final_cuts = [cut for cut in cuts[y] if x2 >= cut >= x]
                offsets = [cut - x for cut in final_cuts[1:]]
                # one piece: the strip itself. Strip.divide would return [strip] too, and
                # keep that list in the strip's own cache: a reference cycle that only
                # Python's cycle collector frees (most strips painted would be garbage
                # of that kind, ~4 a token, and collecting them took the loop's time)
                pieces = [strip] if offsets == [strip.cell_length] else strip.divide(offsets)
                for cut, piece in zip(final_cuts, pieces):
                    if cut in targets:
                        line[cut] = piece


class LoopScreen(Screen):
    """The app's main screen, painted by `RowCroppingCompositor`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._compositor = RowCroppingCompositor()
