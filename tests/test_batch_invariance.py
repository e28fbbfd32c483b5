"""Batch-invariant logits (issue 25): llama-cpp-python built as the Makefile builds it
(patches/llama.cpp-sgemm-f16-vec-dot.patch: F16 matmuls through vec_dot at every pass size)
gives every position of a pass over k positions the logits a
one-position pass gives for the same prefix, bit for bit, on the default model.

The stock build served passes of 2+ positions with llamafile's tinyBLAS and a one-position
pass with ggml's vec_dot, for the F16 KV cache's attention matmuls too: other rounding (up to
0.8 in a logit here), so a verifying pass's or
a batch's draws could part from the plain loop's at a near-tie. This test fails on a wheel built
without the patch (the stock wheel: the pass of 9 positions 0.5 off in a logit), so the property
cannot silently go away (docs/performance.md, "Batch-invariant logits")."""

from __future__ import annotations

import numpy as np
import pytest

from loopchat.engine.engine import Engine

pytestmark = pytest.mark.model

TEXT = "The river ran past the old mill, where the miller counted sacks of grain and sang to the geese."


def test_a_pass_of_k_positions_gives_each_position_the_one_position_pass_s_logits(engine: Engine) -> None:
    assert engine.flash_attn == "off"  # the default model's default (flash attention on: test_batch_run)
    tokens = list(engine.llm.tokenize(TEXT.encode(), add_bos=True, special=False))
    prompt, fed = tokens[:8], tokens[8:17]
    engine.reset()
    try:
        engine.evaluate(prompt)
        single = []
        for t in fed:  # the plain loop's passes: one position each
            engine.forward(t)
            single.append(engine.logits().copy())
        for k in (2, 3, 5, 9):  # a verifying pass of k positions (draft_max 8: up to 9)
            engine.trim(len(prompt))
            rows = engine.evaluate_scored(fed[:k]).copy()
            for j in range(k):
                worst = float(np.abs(rows[j] - single[j]).max())
                assert np.array_equal(rows[j], single[j]), f"k={k}, position {j}: a logit {worst:.3g} off"
    finally:
        engine.reset()
