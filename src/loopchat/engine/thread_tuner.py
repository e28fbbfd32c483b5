"""`threads = "auto"`: the engine picks llama.cpp's thread count from its own forward passes.

Why: llama.cpp's threads meet at a barrier at every graph node, so one thread that the OS
deschedules stalls all of them. On this project's 2-core machine, 2 threads run the
default model fastest when the machine is quiet and at a fraction of 1 thread's rate as
soon as one other CPU-bound program runs (docs/performance.md, "Auto threads"). The
count that wins depends on what else runs *now*, so it is measured, not configured.

How (`ThreadTuner`, pure Python: it is fed forward-pass times and says which count the
next pass uses; the engine applies it with llama_set_n_threads between passes):

- **Probe.** Measure the count in force, then its neighbours (one thread fewer, one
  more), each for `probe_passes` passes after one warm-up pass, and keep walking while a
  neighbour is faster by more than `margin`. The first probe (the engine runs it while
  loading the model) measures 1 thread, then all physical cores, then walks from the
  faster: 1 thread is the safe reference, since one pass at all cores on a busy machine
  can take a hundred times longer, and it is cut after that one pass. A candidate whose pass takes more than
  twice the best mean so far is dropped at once (on a busy machine one such pass can
  take a second). The count with the lowest mean wins; the one in force is kept unless
  another is `margin` faster.
  Means, not medians: the time a reply takes is the sum of its passes. Beside two
  CPU-bound programs 2 threads ran most passes fast but stalled on a few; the median
  chose 2 threads and the reply ran slower than at 1 (docs/performance.md, "Auto
  threads").
- **Lived.** A probe's few passes rarely see such a stall; the passes run while a count
  was in force do. Each count's mean over the passes it ran as the choice is kept, and
  a probe takes the worse of that and its own mean, until other programs' CPU use
  moves or a regular re-check comes: then what was lived is forgotten. (Not when passes
  merely get faster: on a busy machine 1 thread's passes come in slow and fast spells.)
- **Watch.** Once chosen, the mean of the last `window` passes is compared with the
  mean the choice was made on: `drift` times slower or faster (another program
  started or stopped) starts a probe. Not when slower at 1 thread (nor when others'
  CPU use rises there): the machine got busier, only fewer threads could help, and
  there are none; the slower mean becomes the baseline instead.
- **Re-check.** Every `recheck_ms` of forward passes, a probe runs anyway: a program
  that stops while 1 thread is in force does not make 1 thread faster, only 2. A probe
  costs the time its slower passes took beyond the best mean; the next re-check waits until that cost is at most `budget` of the passes run
  meanwhile (up to `max_recheck_ms`). On a busy 2-core machine one pass at 2 threads
  can take seconds against milliseconds at 1: re-checking every 10 s would cost a large
  share of the time, so it backs off to every 2 minutes there.

- **Guard.** No pass may stall the reply for more threads than a measured count below
  them: the engine ends it (llama.cpp's abort callback, probe_guard.py) once it runs
  past `guard_ms()` and redoes it at `safe()`, so that the two together take at most
  max(4x the safe count's mean, 50 ms). Guarded: a probe's passes at a count not yet
  measured (safe: the best measured so far; a measured pass, not the warm-up, is cut at
  2x it, where it would be judged slower anyway), and the count in force when a
  fewer-thread count was measured below it (safe: that count). `cut()` records a
  probe's candidate as at least that slow; a cut of the count in force measures it
  again, guarded (a hiccup costs one cut; a lasting stall falls back). Beside CPU-bound
  programs a 2-thread pass on 2 cores took 1-8.6 s: now it is cut within a few passes'
  time.

- **Others' CPU.** The engine also tells it, about once a second, how many cores'
  worth of CPU time the other programs on the machine use (`OtherCpuMeter`: the
  system's CPU time minus this process's). A change of half a core or more, seen twice
  in a row, starts a probe at once (and ends a back-off): a build that finishes is
  noticed within seconds, not at the next re-check. The probe still decides by pass
  times.

The first probe starts at the machine's physical core count. Every change of count
comes with a one-line reason (`reason`), which the engine records in the step whose
pass first ran with it.
"""

from __future__ import annotations

import statistics
import time
from collections import deque


def _ms(v: float) -> str:
    return f"{v:.1f} ms" if v < 100 else f"{v:.0f} ms"


def _n(n: int) -> str:
    return f"{n} thread{'s' if n != 1 else ''}"


class ThreadTuner:
    """Chooses the thread count of the next forward pass from the times of the last ones."""

    def __init__(
        self,
        max_threads: int,
        *,
        probe_passes: int = 4,
        window: int = 8,
        drift: float = 1.5,
        margin: float = 0.05,
        recheck_ms: float = 10_000.0,
        budget: float = 0.02,
        max_recheck_ms: float = 120_000.0,
        tie: float = 0.10,
    ) -> None:
        self.max = max(1, max_threads)
        self.probe_passes = probe_passes
        self.drift = drift
        self.margin = margin
        self.recheck_ms = recheck_ms
        self.budget = budget
        self.max_recheck_ms = max_recheck_ms
        self._recheck_after = recheck_ms
        self._cost = 0.0  # ms the probe in progress lost to slower candidates
        self._others_at_choice: float | None = None  # others' CPU (cores) once the count was chosen
        self._others_seen: float | None = None  # the last sample
        self._others_skip = 0  # samples to skip after a choice (they may span the probe)
        #: a probe runs because other programs' CPU rose: a pass it cannot measure (a batch's) takes fewer threads
        self.busier = False
        #: the count for a pass of many tokens (a prefill, a batch of sequences), once chosen: the
        #: largest count measured whose single-token pass took at most `tie` more than the best's
        #: (a tie on memory-bound single passes; compute-bound passes of many tokens gain from the
        #: cores), else the count chosen (docs/models.md, "threads")
        self.many = self.max
        self.tie = tie
        self._lived: dict[int, tuple[float, int]] = {}  # count -> (ms, passes) run as the choice
        self._period = (0.0, 0)  # (ms, passes) run under the current choice
        self.threads = self.max
        self.reason = "not measured yet"
        self.changes = 0  # bumped with every new reason: the engine records it once
        self._window: deque[float] = deque(maxlen=window)
        self._baseline = 0.0  # the mean the count in force was chosen on
        self._since_ms = 0.0  # forward-pass time since the last choice
        # probe state (None: not probing)
        self._results: dict[int, float] | None = None
        self._cut: set[int] = set()  # counts of this probe whose pass was cut (their result: a lower bound)
        self._fallback: tuple[int, float] | None = None  # a count below the choice, measured: (count, ms)
        self._home = self.threads
        self._why = ""
        self._samples: list[float] = []
        self._skip = 0
        if self.max == 1:
            self.reason = "1 thread: the machine has one physical core"
            return  # nothing to choose from: never probes
        self._start_probe("first measurement", reuse_window=False)
        self.threads = 1  # measured first (the safe reference), then all the cores
        self.reason = "1 thread until measured"

    @property
    def probing(self) -> bool:
        return self._results is not None

    @property
    def many_threads(self) -> int:
        """The count for a pass of many tokens outside a probe: `many` while the other programs
        used less than half a core at the last sample (none yet: the count in force)."""
        seen = self._others_seen
        return self.many if seen is not None and seen < 0.5 else self.threads

    @property
    def others_base(self) -> float | None:
        """The other programs' CPU (cores) that note_others compares with since the count was
        chosen (None: not sampled yet, so a program started now would be part of it)."""
        return self._others_at_choice

    # ------------------------------------------------------------------------------
    def observe(self, ms: float) -> int:
        """Record one single-token forward pass run with `self.threads`; return the
        count the next pass should use (the new `self.threads`)."""
        if self._results is not None:
            self._probe_pass(ms)
            return self.threads
        if self.max == 1:
            return 1
        self._window.append(ms)
        self._since_ms += ms
        lived_ms, lived_n = self._lived.get(self.threads, (0.0, 0))
        self._lived[self.threads] = (lived_ms + ms, lived_n + 1)
        self._period = (self._period[0] + ms, self._period[1] + 1)
        if len(self._window) == self._window.maxlen and self._baseline > 0:
            now = statistics.fmean(self._window)
            if now > self.drift * self._baseline:
                if self.threads == 1:  # busier: only fewer threads could help, and there are none
                    self._baseline = now  # the new normal, for noticing when it gets faster
                    return self.threads
                self._start_probe(f"passes {now / self._baseline:.1f}x slower than when chosen")
                return self.threads
            if now * self.drift < self._baseline:
                self._start_probe(f"passes {self._baseline / now:.1f}x faster than when chosen")
                return self.threads
        if self._since_ms >= self._recheck_after:
            self._lived.clear()  # a fresh look: the machine may have changed unseen
            self._start_probe("regular re-check")
        return self.threads

    def safe(self) -> int | None:
        """Where a guarded pass is redone: while a probe runs a count not yet measured,
        the best count measured so far; while a count is in force with a measured
        fewer-thread count below it, that count; else None (the pass is not guarded)."""
        r = self._results
        if r is None:
            return self._fallback[0] if self._fallback is not None else None
        if not r or self.threads in r:
            return None
        return self._best()

    def guard_ms(self, floor_ms: float = 50.0) -> float | None:
        """How long the next pass may run before the engine ends it (None: not
        guarded): the bound max(4x the safe count's mean, `floor_ms`) less one pass at
        the safe count, which redoes it."""
        safe = self.safe()
        if safe is None:
            return None
        ref = self._results[safe] if self._results is not None else self._fallback[1]  # type: ignore[index]
        limit = max(4.0 * ref, floor_ms) - ref
        if self._results is not None and not self._skip:  # past 2x the best, a probe's pass is judged slower anyway
            limit = min(limit, 2.0 * ref)
        return limit

    def cut(self, ms: float) -> int:
        """The pass at `self.threads` was ended after `ms` (past `guard_ms()`): record
        that count as at least that slow, go on with the probe, and return the count to
        redo the pass at (`safe()`). The next pass uses `self.threads`."""
        safe = self.safe()
        assert safe is not None, "only a guarded pass is cut"
        if self._results is None:  # the count in force stalled: measure it again, guarded
            self._start_probe(f"a pass at {_n(self.threads)} ran past {_ms(ms)}", reuse_window=False)
            self._results[safe] = self._fallback[1]  # type: ignore[index]
            self._cost += ms
            self._next_candidate()  # the count in force again, after one warm-up pass
            return safe
        self._cost += ms  # all of it: the pass is run again
        self._cut.add(self.threads)
        self._results[self.threads] = ms
        self._next_candidate()
        return safe

    def note_others(self, cores: float) -> None:
        """The cores' worth of CPU time other programs used since the last call (about a
        second ago): a lasting change of half a core or more starts a probe."""
        previous, self._others_seen = self._others_seen, cores
        if self.max == 1 or self._results is not None:
            return
        if self._others_skip:
            self._others_skip -= 1
            return
        base = self._others_at_choice
        if base is None:  # the first sample since the count was chosen
            self._others_at_choice = cores
        elif previous is not None and self.threads == 1 and cores > base and previous > base:
            return  # busier at 1 thread: only fewer threads could help, and there are none
        elif previous is not None and abs(cores - base) >= 0.5 and abs(previous - base) >= 0.5:
            self._recheck_after = self.recheck_ms  # a new situation: no back-off
            self._lived.clear()
            self.busier = cores > base
            self._start_probe(f"other programs' CPU use went from {base:.1f} to {cores:.1f} cores")

    # ------------------------------------------------------------------------------
    def _start_probe(self, why: str, *, reuse_window: bool = True) -> None:
        self._results = {}
        self._cut = set()
        self._home = self.threads
        self._why = why
        self._samples = []
        self._skip = 0
        self._cost = 0.0
        if reuse_window and len(self._window) == self._window.maxlen:
            # the passes just watched are a fresh measurement of the count in force
            self._results[self.threads] = statistics.fmean(self._window)
            self._next_candidate()

    def _probe_pass(self, ms: float) -> None:
        results = self._results
        assert results is not None
        best = min(results.values(), default=None)
        if best is not None and ms > best:
            self._cost += ms - best
        if self._skip:
            self._skip -= 1
            if best is not None and ms > 4 * best:  # even the warm-up says: much slower
                self._measured(ms)
            return
        self._samples.append(ms)
        if best is not None and ms > 2 * best:
            self._measured(ms)  # clearly worse: no need to sit through more of it
        elif len(self._samples) >= self.probe_passes:
            self._measured(statistics.fmean(self._samples))

    def _measured(self, mean_ms: float) -> None:
        assert self._results is not None
        lived_ms, lived_n = self._lived.get(self.threads, (0.0, 0))
        if lived_n >= 16:  # enough passes run with it to have met its stalls
            mean_ms = max(mean_ms, lived_ms / lived_n)
        self._results[self.threads] = mean_ms
        self._next_candidate()

    def _best(self) -> int:
        r = self._results
        assert r
        best = min((n for n in r if n not in self._cut), key=r.__getitem__)  # a cut's time is a lower bound
        home = self._home
        if best != home and home in r and home not in self._cut and r[best] > (1 - self.margin) * r[home]:
            return home  # not faster by more than the margin: no change for noise
        return best

    def _next_candidate(self) -> None:
        r = self._results
        assert r is not None
        best = self._best()
        if self._home not in r:  # the first probe: 1 thread measured, now all the cores
            self._switch(self._home, f"probing {_n(self._home)} ({self._why})")
            return
        for c in (best - 1, best + 1):
            if 1 <= c <= self.max and c not in r:
                lived_ms, lived_n = self._lived.get(c, (0.0, 0))
                if lived_n >= 16:  # known from the passes it ran: no need to run it again
                    r[c] = lived_ms / lived_n
                    self._next_candidate()
                    return
                self._switch(c, f"probing {_n(c)} ({self._why})")
                return
        self._conclude(best)

    def _switch(self, n: int, reason: str) -> None:
        self.threads = n
        self._samples = []
        self._skip = 1  # the first pass after a change of count pays for the change
        self.reason = reason
        self.changes += 1

    def _conclude(self, best: int) -> None:
        r = self._results
        assert r is not None
        others = ", ".join(
            f"{n}: {'cut at ' if n in self._cut else ''}{_ms(v)}" for n, v in sorted(r.items()) if n != best
        )
        measured = f"{_ms(r[best])}/pass vs {others}" if others else f"{_ms(r[best])}/pass"
        first = not self._baseline  # the first measurement chooses; nothing was kept
        verb = "kept" if best == self._home and not first else "chose"
        reason = f"{verb} {_n(best)}: {measured} ({self._why})"
        if best != self._home:
            # leaving a choice that turned out slower: the time it lost counts as this
            # probe's cost (a count that stalls now and then is not retried at once)
            period_ms, period_n = self._period
            self._cost += max(0.0, period_ms - period_n * r[best])
        self._period = (0.0, 0)
        if self._cost > self.budget * self.recheck_ms:
            self._recheck_after = min(self.max_recheck_ms, self._cost / self.budget)
            reason += f"; re-check after {self._recheck_after / 1000:.0f} s"
        else:
            self._recheck_after = self.recheck_ms
        below = [n for n in r if n < best and n not in self._cut]
        self._fallback = (max(below), r[max(below)]) if below else None
        tied = [n for n in r if n > best and n not in self._cut and r[n] <= (1 + self.tie) * r[best]]
        self.many = max(tied, default=best)
        self._results = None
        self.busier = False
        self._others_at_choice = None  # the second sample from now, all of it under this choice
        self._others_skip = 1
        self._baseline = r[best]
        self._window.clear()
        self._since_ms = 0.0
        self._samples = []
        self._skip = 0
        self.threads = best
        self.reason = reason
        self.changes += 1


class OtherCpuMeter:
    """The CPU time the machine's other programs use, in cores: the system's busy CPU
    time (psutil.cpu_times: user, nice, system, irq, softirq, steal) minus this
    process's own (every thread of it), over the time since the last sample."""

    def __init__(self) -> None:
        import psutil

        self._cpu_times = psutil.cpu_times
        self._last = self._read()

    def _read(self) -> tuple[float, float, float]:
        t = self._cpu_times()
        busy = (
            t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)
        )
        return time.monotonic(), busy, time.process_time()

    def sample(self) -> float:
        """Others' cores since the last sample (0 when less than a tick has passed)."""
        now = self._read()
        wall = now[0] - self._last[0]
        others = (now[1] - self._last[1]) - (now[2] - self._last[2])
        self._last = now
        return max(0.0, others / wall) if wall > 0 else 0.0
