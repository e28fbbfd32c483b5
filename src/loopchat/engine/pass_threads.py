"""The thread count of the pass behind each step's logits, and why (a collaborator of the
reply run; auto threads: auto_threads.py and thread_tuner.py).

A step records the count of the forward pass that produced its logits, and the tuner's
reason on step 0, wherever the tuner gave a new reason and wherever the count changed;
`probe_cut_ms` when a probe's pass was cut and redone. The reason is read before the pass
(the tuner may conclude during it: its new reason belongs to the next count). Pure: no
model, no clock. The count is also the sampler's (sampler_fused.use_threads): the chain that
follows the pass may split its long passes over as many threads, never more.
"""

from __future__ import annotations

from loopchat.engine import sampler_fused
from loopchat.engine.thread_tuner import ThreadTuner


class PassThreads:
    def __init__(self, tuner: ThreadTuner | None, threads: int) -> None:
        self.tuner = tuner
        #: the pass behind the next step: its count, and how long a probe ran before its cut
        self.threads, self.cut_ms = threads, 0.0
        self.reason, self.change = (tuner.reason, tuner.changes) if tuner is not None else ("", 0)
        self._noted_change, self._noted_threads = -1, threads
        sampler_fused.use_threads(threads)  # (the chain's long passes may use the pass's cores: sampler_fused)

    def reason_to_record(self) -> str:
        """The reason the step about to be recorded carries ("" where nothing changed)."""
        reason = ""
        if self.change != self._noted_change or self.threads != self._noted_threads:
            reason, self._noted_change = self.reason, self.change
        self._noted_threads = self.threads
        return reason

    def before_pass(self) -> None:
        if self.tuner is not None:
            self.reason, self.change = self.tuner.reason, self.tuner.changes

    def after_pass(self, threads: int, cut_ms: float) -> None:
        self.threads, self.cut_ms = threads, cut_ms
        sampler_fused.use_threads(threads)
