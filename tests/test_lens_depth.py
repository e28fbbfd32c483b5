"""The lens depth (chat/lens_depth.py; Shift+F7): the first layer from which on the logit
lens ranks the drawn token first, computed from the lens rows alone; and its colours."""

from __future__ import annotations

from loopchat.chat.lens_depth import lens_depth
from loopchat.events import LensRow
from loopchat.tui.token_styles import DEPTH_BANDS, NOT_TOP, depth_bands, depth_colour


def _rows(ranks: list[int]) -> list[LensRow]:
    return [LensRow(i, 7, "x", 0.5, rank, 0.1, 1.0) for i, rank in enumerate(ranks)]


def test_the_depth_is_where_the_drawn_token_became_first_and_stayed_first() -> None:
    assert lens_depth(_rows([1, 1, 1, 1])) == 0  # first from the first layer on
    assert lens_depth(_rows([3, 2, 1, 1])) == 2
    assert lens_depth(_rows([1, 4, 1, 1])) == 2  # first at layer 0, then not: it "stayed" from 2
    assert lens_depth(_rows([5, 5, 5, 1])) == 3  # the last layer only
    assert lens_depth(_rows([1, 1, 1, 2])) is None  # not the model's own top: drawn by sampling
    assert lens_depth([]) is None


def test_the_colours_split_the_layers_before_the_last_in_quarters() -> None:
    # SmolLM2-135M: 30 layers; Gemma 3 270M: 18
    assert [label for label, _ in depth_bands(30)] == ["0–7", "8–14", "15–21", "22–28", "29 last"]
    assert [label for label, _ in depth_bands(18)] == ["0–4", "5–8", "9–12", "13–16", "17 last"]
    for layers in (2, 5, 18, 30):
        bands = depth_bands(layers)
        for depth in range(layers):
            label = next(lbl for lbl, c in bands if c == depth_colour(depth, layers))
            first = label.split(" ")[0].split("–")
            assert int(first[0]) <= depth <= int(first[-1]), (layers, depth, label)
    assert depth_colour(None, 30) == NOT_TOP and depth_colour(29, 30) == DEPTH_BANDS[-1]
