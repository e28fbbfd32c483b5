"""The most likely token a stage removed, where the stage's own selection does not hand it
over (the unsorted form, sampler_stages): one copy of the logits and one argmax.

The token is the largest logit among those that entered the stage and did not leave it;
equal ones: the lowest id (argmax's first), the token a stable sort by logit would have
cut first.
"""

from __future__ import annotations

import numpy as np

from loopchat.engine.sampler_scratch import scratch


def first_cut(work: np.ndarray, entered: np.ndarray | None, kept: np.ndarray) -> int:
    """The id of the largest logit of `work` among `entered` (vocabulary ids; None: every
    token) and not in `kept` (ids); -1 when every one was kept."""
    n = work.shape[0]
    if (n if entered is None else entered.shape[0]) <= kept.shape[0]:
        return -1
    tmp = scratch.get("cut", n, np.float32)
    if entered is None:
        np.copyto(tmp, work)
    else:
        tmp.fill(-np.inf)
        tmp[entered] = work[entered]
    tmp[kept] = -np.inf
    i = int(np.argmax(tmp))
    return -1 if tmp[i] == -np.inf else i  # (-1 too when the removed tokens' logits were all -inf)


def cut_of_top(top: np.ndarray, k: int) -> int:
    """The first token a sorted top-`k` cut: top[k] (`top` holds at least k + 1, largest
    first), or -1 when `top` holds only k."""
    return int(top[k]) if top.shape[0] > k else -1
