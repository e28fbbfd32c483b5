"""What a reply's Step and Pending events say of the die (run.py's ReplyRun): the sampler's result
in the events' shape, its tokens named.

`RunDie.of` gives the fields both events share: the raw and the sampled top lists as Candidates
(each token's text and partial bytes asked of the host once: `faces`, the host's table where it
keeps one for the model, shared by a batch's sequences (slot_host.py), else the reply's own), the
two entropies, how many candidates were kept, the stage reports (with their cut tokens' texts), and
the forward pass behind the logits. Without the request's `step_detail` the sampled top list is
left out and the stage reports keep no texts (request.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from loopchat.engine.run_host import RunHost
from loopchat.engine.sampler import SampleResult
from loopchat.events import Candidate
from loopchat.stage_report import StageReport, with_cut_text
from loopchat.token_faces import partial_bytes


class RunDie:
    """The die of each draw of one reply on `host`, in its events' shape."""

    def __init__(self, host: RunHost, step_detail: bool) -> None:
        self.host = host
        self.detail = step_detail
        faces = getattr(host, "faces", None)
        self.faces: dict[int, tuple[str, bytes | None]] = faces if faces is not None else {}

    def of(self, res: SampleResult, forward_ms: float, forward_tokens: int) -> dict[str, Any]:
        """What a Step and a Pending both say of the die: its two distributions and the forward
        pass that gave the logits."""
        detail = self.detail
        return {
            "raw_top": self.candidates(res.raw_top_ids, res.raw_top_probs),
            "sampled_top": self.candidates(res.sampled_top_ids, res.sampled_top_probs) if detail else None,
            "raw_entropy": res.raw_entropy,
            "sampled_entropy": res.sampled_entropy,
            "candidates_kept": res.kept,
            "stages": self.stages(res.stages) if detail else res.stages,
            "forward_ms": forward_ms,
            "forward_tokens": forward_tokens,
        }

    def stages(self, stages: tuple[StageReport, ...]) -> tuple[StageReport, ...]:
        """The stage reports with their cut tokens' texts."""
        return tuple(with_cut_text(r, self.host.piece_text(r.cut_id)) if r.cut_id >= 0 else r for r in stages)

    def candidates(self, ids: np.ndarray, probs: np.ndarray) -> tuple[Candidate, ...]:
        """(tolist: Python ints and floats.) Each token's text and bytes are asked of the host
        once (`faces`): ~20 candidates a step, mostly tokens already seen."""
        faces, out = self.faces, []
        for i, p in zip(ids.tolist(), probs.tolist()):
            face = faces.get(i)
            if face is None:
                face = faces[i] = (self.host.piece_text(i), partial_bytes(self.host.piece(i)))
            out.append(Candidate(i, face[0], p, face[1]))
        return tuple(out)
