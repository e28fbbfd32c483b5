"""`threads = "auto"` applied to one engine's llama.cpp context (engine.py uses it).

The pure decisions are thread_tuner.py's; this module runs them: it times each
single-token forward pass, feeds the time to the tuner, applies the count the tuner
says with llama_set_n_threads between passes, tells the tuner about once a second how
much CPU the other programs use, and guards a probe's passes (probe_guard.py): a pass at
a count not yet measured that runs past `ThreadTuner.guard_ms()` is ended and redone at
the safe count, so that the reply never waits seconds for a probe. Logits do not depend
on the thread count (checked bit for bit in tests/test_probe_guard.py), so the redone
pass gives the very logits the probe would have, and the draw is the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from loopchat.engine.probe_guard import Flag, PassGuard
from loopchat.engine.thread_tuner import OtherCpuMeter, ThreadTuner

if TYPE_CHECKING:
    from loopchat.engine._llama_ffi import LlamaCalls

ABORTED = 2  # llama_decode's code for a pass ended by the abort callback


class AutoThreads:
    """The tuner at work on one context: create it after the load, call it from the
    thread that owns the Llama."""

    def __init__(self, calls: LlamaCalls, abort: Flag, cancelled: Callable[[], bool], tuner: ThreadTuner) -> None:
        self.tuner = tuner
        self._c = calls
        self.threads = tuner.threads  # the count llama.cpp has now
        self._others = OtherCpuMeter()  # sampled about once a second while generating
        self._others_at = time.perf_counter()
        self._cancelled = cancelled
        self._guard = PassGuard(abort, cancelled)
        #: the last pass: the count that produced its logits, and how long a probe's pass
        #: ran before it was cut and redone (0.0: none was)
        self.pass_threads = self.threads
        self.cut_ms = 0.0

    def set_threads(self, n: int) -> None:
        if n != self.threads:
            self._c.set_threads(n)
            self.threads = n

    def prefill_threads(self, watch: bool = False) -> int:
        """The count for a pass of many tokens (a prompt's prefill, a pass of several
        sequences), set: the count in force, or more where more tied with it on single passes
        and the others are idle (ThreadTuner.many_threads); while a probe runs, the fewer of the count it
        measures and the best measured so far (such a pass is not guarded, nor a probe's
        measure: at a count not yet measured it could stall for seconds). Not the fewer-
        thread count that guards the one in force (ThreadTuner.safe() outside a probe):
        a compute-bound pass at 1 of 2 idle cores took twice as long (docs/performance.md,
        "Many-token passes at the count in force"). `watch`: the others' CPU sampled as a
        single pass does (a batch of sequences, whose passes the tuner does not see): a
        program that starts mid-batch starts a probe, and while a probe that other programs'
        CPU started runs, such a pass takes one thread fewer (a batch cannot finish it)."""
        if watch:
            self._watch_others(time.perf_counter())
        t = self.tuner
        n, safe = (t.threads, t.safe()) if t.probing else (t.many_threads, None)
        n = n if safe is None else min(n, safe)
        if t.probing and t.busier:  # (a batch never feeds the probe: it would keep the count)
            n = max(1, n - 1)
        self.set_threads(n)
        return self.threads

    def decode(self, token: int, pos: int) -> int:
        """One single-token pass at position `pos`, timed and fed to the tuner (a probe's
        pass guarded); returns llama_decode's code (0: the logits are ready)."""
        self.set_threads(self.tuner.threads)
        self.cut_ms = 0.0
        limit = self.tuner.guard_ms()
        t0 = time.perf_counter()
        if limit is None:
            rc = self._c.decode_one(token, pos)
        else:
            self._guard.arm(limit)
            rc = self._c.decode_one(token, pos)
            fired = self._guard.disarm()
            if rc == ABORTED and fired and not self._cancelled():
                return self._redo(token, pos, (time.perf_counter() - t0) * 1000.0)
        if rc != 0:
            return rc
        self._c.synchronize()
        ms = (time.perf_counter() - t0) * 1000.0
        self.pass_threads = self.threads
        self._watch_others(t0)
        self.tuner.observe(ms)
        return 0

    def _watch_others(self, now: float) -> None:
        """The others' CPU told to the tuner, about once a second (`now`: perf_counter seconds)."""
        if now - self._others_at >= 1.0:
            self._others_at = now
            self.tuner.note_others(self._others.sample())

    def _redo(self, token: int, pos: int, cut_ms: float) -> int:
        """The probe's pass was cut after `cut_ms`: drop what it left in the KV cache and
        run it again at the safe count (not fed to the tuner: the cut was)."""
        self._c.forget_from(pos)
        self.set_threads(self.tuner.cut(cut_ms))
        self.cut_ms = cut_ms
        rc = self._c.decode_one(token, pos)
        if rc == 0:
            self._c.synchronize()
        self.pass_threads = self.threads
        return rc

    def calibrate(self, token: int, n_ctx: int, max_passes: int = 40) -> None:
        """The tuner's first measurement, run at load on passes of `token` at positions
        1, 2, ...: the first reply's prefill then already runs with a measured count (on
        a busy machine, a prefill at the wrong count takes seconds). The load takes a
        few passes longer (docs/performance.md, "Auto threads")."""
        for pos in range(1, min(max_passes, n_ctx - 1)):
            if not self.tuner.probing or self.decode(token, pos) != 0:
                break
        self.set_threads(self.tuner.threads)

    def close(self) -> None:
        self._guard.close()
