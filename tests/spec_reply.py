"""A reply under a draft, for the views of speculative passes (issue 25): the recorded
real reply (tests/data/reply.jsonl) with its steps grouped into verifying passes as a
prompt-lookup draft would have given them (passes.py). Each refused draft is a candidate
of its step's own distributions, with that step's raw and sampled probability for it, so
the figures on screen are the reply's own.

`LAYOUT`: the passes after step 0 (the prefill's, a plain pass), in order: (drafted, kept,
drawn); a plain pass is (0, 0, True) with no PassReport.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from loopchat.event_json import to_json_dict
from loopchat.events import Finish, Step
from loopchat.passes import PassReport, RejectedDraft
from loopchat.trace import read_trace

DATA = Path(__file__).parent / "data"
REPLY_TRACE = DATA / "reply.jsonl"

#: (drafted, kept, drawn) for each pass after step 0; None: a plain pass
LAYOUT: tuple[tuple[int, int, bool] | None, ...] = (
    (5, 3, True),  # steps 1-4: 3 drafted and kept, the 4th drawn after a refusal
    None,  # step 5: a plain pass
    (4, 4, True),  # steps 6-10: every draft kept, and the pass's own token
    (2, 0, True),  # step 11: the first draft refused
    (3, 2, True),  # steps 12-14
)
PASS_MS = (14.2, 12.8, 9.9, 11.5)
DRAFT_MS = 0.31


def _refused(st: Step) -> RejectedDraft:
    """A draft the step's draw refused: its most likely candidate that is not the drawn
    token, with the step's raw and sampled probabilities for it."""
    c = next(c for c in st.raw_top if c.token_id != st.token_id)
    sampled = {s.token_id: s.prob for s in st.sampled_top or ()}
    assert c.token_id is not None
    return RejectedDraft(c.token_id, c.text, c.prob, sampled.get(c.token_id, 0.0))


def speculative_steps(steps: list[Step]) -> list[Step]:
    """`steps` (a plain reply's) grouped into the passes of LAYOUT; the steps after them plain."""
    out = [steps[0]]
    at, number, verifying = 1, 1, 0
    for shape in LAYOUT:
        if shape is None:
            out.append(steps[at])
            at, number = at + 1, number + 1
            continue
        drafted, kept, drawn = shape
        p = PassReport(number, drafted, kept, drawn, "lookup", PASS_MS[verifying], DRAFT_MS)
        for k in range(kept + int(drawn)):
            st = steps[at + k]
            is_kept = k < kept
            rejected = _refused(st) if not is_kept and kept < drafted else None
            out.append(dataclasses.replace(st, pass_report=p, drafted=is_kept, rejected=rejected))
        at += kept + int(drawn)
        number += 1
        verifying += 1
    out += steps[at:]
    return out


def speculative_events() -> list[Any]:
    """The recorded reply's events, its steps grouped into passes."""
    _, traced = read_trace(REPLY_TRACE)
    events = [t.event for t in traced]
    steps = speculative_steps([e for e in events if isinstance(e, Step)])
    head = [e for e in events if not isinstance(e, (Step, Finish))]
    return [*head, *steps, *(e for e in events if isinstance(e, Finish))]


def write_speculative_trace(path: Path) -> Path:
    """The speculative reply as a trace file (`loopchat replay` plays it)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"kind": "header", "schema_version": 1, "loopchat_version": "test"}) + "\n")
        for ev in speculative_events():
            f.write(json.dumps(to_json_dict(ev), ensure_ascii=False) + "\n")
    return path
