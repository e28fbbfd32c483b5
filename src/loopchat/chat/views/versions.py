"""Alt+V: the versions of a reply side by side, pass by pass (after Shift+F5's N replies in one
batch, or F5's and branches' versions): where they part and with what probabilities.

A row per forward pass (step index): each version's token and the probability it was drawn
with (its `sampled_prob`: in the distribution the sampler drew from). `parted_at` is the first
pass at which the versions' tokens are not all the same; the `parting` lines name, for each
version, the token it drew there and both its probabilities. No Textual here: the screen
(tui/versions_screen.py) draws this.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from loopchat.batch import BatchPass, pass_line
from loopchat.chat.conversation import ReplyRecord
from loopchat.events import Step


@dataclass(frozen=True)
class VersionsView:
    title: str
    heads: list[str]  # a column's head per version: "v2 (reply 5)"
    rows: list[tuple[int, list[str], bool]]  # (pass, a cell per version, whether they differ at it)
    parted_at: int | None  # the first pass (step index) where the tokens differ; None: they never do
    parting: list[str]  # at that pass: what each version drew, with both probabilities
    batch: str  # the batched pass's cost line (median pass), "" when the versions were not one batch


def _token(step: Step | None) -> str:
    if step is None:
        return "·"
    text = "⏹" if step.is_stop else step.piece.replace("\n", "⏎").replace("\t", "⇥")
    prob = "" if step.sampled_prob is None else f" {step.sampled_prob:.2f}"
    return f"{text!r}{prob}" if not step.is_stop else f"{text}{prob}"


def _parting_line(k: int, step: Step | None) -> str:
    if step is None:
        return f"v{k}: had ended"
    raw = "not given" if step.raw_prob is None else f"{step.raw_prob:.4f}"
    sampled = "not given" if step.sampled_prob is None else f"{step.sampled_prob:.4f}"
    what = "the end token" if step.is_stop else repr(step.piece)
    return f"v{k} drew {what}: p {sampled} as drawn (raw {raw}), rank {step.sampled_rank}"


def versions_view(recs: list[ReplyRecord], *, context: int = 3, most: int = 40) -> VersionsView:
    """The versions `recs` (a turn's, in order) side by side from a few passes before they part."""
    steps = [{s.index: s for s in r.steps} for r in recs]
    last = max((max(d) for d in steps if d), default=-1)
    parted = next(
        (i for i in range(last + 1) if len({(d[i].token_id if i in d else None) for d in steps}) > 1),
        None,
    )
    first = 0 if parted is None else max(0, parted - context)
    rows = []
    for i in range(first, min(last + 1, first + most)):
        cells = [_token(d.get(i)) for d in steps]
        rows.append((i, cells, len({(d[i].token_id if i in d else None) for d in steps}) > 1))
    parting = [] if parted is None else [_parting_line(k + 1, d.get(parted)) for k, d in enumerate(steps)]
    passes = {s.batch.number: s.batch for r in recs for s in r.steps if s.batch is not None}
    batch = ""
    if passes:
        median = sorted(passes.values(), key=lambda p: p.ms)[len(passes) // 2]
        singles = [p.single_ms for p in passes.values() if p.single_ms is not None]
        batch = "a batched pass (median): " + pass_line(
            BatchPass(median.number, median.size, median.ms, statistics.median(singles) if singles else None)
        )
        if any(r.start is not None and r.start.flash_attn == "off" for r in recs):  # (docs/trace-format.md)
            batch += "\nflash attention off: a batched pass's probabilities can differ from one sequence's by a few hundredths"
    where = "they never part" if parted is None else f"they part at pass {parted + 1}"
    title = f"{len(recs)} versions of the reply · {where}"
    heads = [f"v{k + 1} (reply {r.number})" for k, r in enumerate(recs)]
    return VersionsView(title, heads, rows, parted, parting, batch)


__all__ = ["VersionsView", "versions_view"]
