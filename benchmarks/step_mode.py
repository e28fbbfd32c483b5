"""Step mode (issue 13): what a pause costs, and whether the loop runs at its free rate
after `resume()`. Measured side by side in one run, on the default model.

Each round runs, in alternating order, two replies of --tokens tokens from the same
prompt with the same settings and seed (no KV cache reused: a full prefill each, so
both draw the very same tokens, which is checked), each in a thread of its own:
(a) free: `engine.generate` with no step control;
(b) paused: a StepControl that grants --at draws (`step(k)`), so the loop stops before
    the draw of token k+1 (a `Pending` event). The process then does nothing for
    --pause seconds (the main thread in `Event.wait(timeout)`), then `resume()`.
Over the pause: the process's CPU time (`time.process_time()`: every thread, llama.cpp's
included) and the engine thread's own (its CPU clock, `time.pthread_getcpuclockid`),
against the wall time. Target: CPU / wall ~0 (< 0.01).
After the resume: the decode rate of the tokens after the first one drawn after the
pause, from the engine's own clock (Step.elapsed_ms), against the same tokens of (a).
Target: (b) / (a) >= 0.97 (the medians over the rounds). Beside it, the median time of
a pass (forward + sampling) over the same tokens, which descheduled passes on a busy
machine move less: free / resumed.

--busy N starts N CPU-bound processes beside (a busy machine; tests/cpu_burners.py).

    .venv/bin/python benchmarks/step_mode.py [--rounds 5] [--tokens 160] [--at 32] [--pause 2] [--busy 2]
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from cpu_burners import cpu_burners  # noqa: E402

from loopchat.engine.cores import physical_cores  # noqa: E402
from loopchat.engine.engine import Engine  # noqa: E402
from loopchat.events import Finish, Message, Pending, Step  # noqa: E402
from loopchat.model_files import builtin_model_path  # noqa: E402
from loopchat.settings import SamplingSettings  # noqa: E402
from loopchat.step_control import StepControl  # noqa: E402

MESSAGES = (
    Message("system", "You are a helpful assistant."),
    Message("user", "Write a long story about a lighthouse keeper and a storm."),
)


def rate_after(steps: list[Step], first: int) -> float:
    """Decode tokens/s from step `first` to the last (the engine's clock)."""
    tail = [s for s in steps if s.index >= first]
    return (len(tail) - 1) * 1000.0 / (tail[-1].elapsed_ms - tail[0].elapsed_ms)


def pass_ms(steps: list[Step], first: int) -> float:
    """The median time of a pass (forward + sampling) from step `first` on: a figure a few
    descheduled passes move less than the rate."""
    return statistics.median(s.forward_ms + s.sample_ms for s in steps if s.index >= first)


def free(engine: Engine, s: SamplingSettings) -> list[Step]:
    """A free run, in a thread of its own as the paused run is (not this main thread: on
    the shared machine, 2 llama threads called from a process's main thread ran 3-20x
    slower than from another thread of it, see docs/performance.md)."""
    steps: list[Step] = []

    def run() -> None:
        steps.extend(e for e in engine.generate(MESSAGES, s, ignore_eos=True, reuse_at_most=0) if isinstance(e, Step))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(300)
    return steps


def paused(engine: Engine, s: SamplingSettings, at: int, pause: float) -> tuple[list[Step], dict]:
    control = StepControl(paused=True)
    control.step(at)
    events: queue.Queue = queue.Queue()

    def run() -> None:
        for e in engine.generate(MESSAGES, s, ignore_eos=True, reuse_at_most=0, control=control):
            events.put(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    seen = []
    while not isinstance(e := events.get(timeout=120), Pending):
        seen.append(e)
    while not control.waiting:  # Pending is emitted just before the wait begins
        threading.Event().wait(0.001)
    clock = time.pthread_getcpuclockid(t.ident)
    c0, e0, w0 = time.process_time(), time.clock_gettime(clock), time.perf_counter()
    threading.Event().wait(pause)
    c1, e1, w1 = time.process_time(), time.clock_gettime(clock), time.perf_counter()
    assert control.waiting
    control.resume()
    t.join(300)
    while not events.empty():
        seen.append(events.get())
    assert isinstance(seen[-1], Finish)
    wall = w1 - w0
    return [e for e in seen if isinstance(e, Step)], {
        "wall": wall,
        "cpu": c1 - c0,
        "engine_cpu": e1 - e0,
        "pending": e.index,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--at", type=int, default=32, help="draws before the pause")
    ap.add_argument("--pause", type=float, default=2.0, help="seconds paused")
    ap.add_argument(
        "--threads", type=int, default=physical_cores(), help="pinned llama.cpp threads (default: physical cores)"
    )
    ap.add_argument("--busy", type=int, default=0, metavar="N", help="run beside N CPU-bound processes")
    args = ap.parse_args()
    model = builtin_model_path()
    s = SamplingSettings(seed=1, max_tokens=args.tokens)
    print(
        f"model {model.name}; {os.cpu_count()} CPUs; threads {args.threads}; {args.busy} CPU-bound processes beside; "
        f"load average {os.getloadavg()[0]:.2f} before"
    )
    print(f"{args.tokens} tokens a reply, paused before token {args.at + 1} for {args.pause:g} s, {args.rounds} rounds")
    with cpu_burners(args.busy, seconds=3600.0):
        engine = Engine(model, n_ctx=2048, threads=args.threads, log_path=Path("/dev/null"))
        free(engine, s.replace(max_tokens=32))  # warm-up
        free_rates, resumed_rates, cpu, engine_cpu, wall = [], [], [], [], []
        free_pass, resumed_pass = [], []
        for r in range(args.rounds):
            order = ("free", "paused") if r % 2 == 0 else ("paused", "free")
            for which in order:
                if which == "free":
                    a = free(engine, s)
                else:
                    b, m = paused(engine, s, args.at, args.pause)
            assert [x.token_id for x in a] == [x.token_id for x in b], "the paused run drew other tokens"
            assert m["pending"] == args.at
            first = args.at + 1  # the first token drawn after the resume is `at`; its rate from the next
            fa, fb = rate_after(a, first), rate_after(b, first)
            pa, pb = pass_ms(a, first), pass_ms(b, first)
            free_pass.append(pa)
            resumed_pass.append(pb)
            free_rates.append(fa)
            resumed_rates.append(fb)
            cpu.append(m["cpu"])
            engine_cpu.append(m["engine_cpu"])
            wall.append(m["wall"])
            print(
                f"round {r + 1}: paused {m['wall']:.2f} s: process CPU {m['cpu'] * 1000:.1f} ms, engine thread "
                f"{m['engine_cpu'] * 1000:.2f} ms · after resume {fb:.1f} tok/s, free {fa:.1f} tok/s: {fb / fa:.3f}x · median pass {pb:.2f} vs {pa:.2f} ms",
                flush=True,
            )
        engine.close()
    print(f"load average {os.getloadavg()[0]:.2f} after")
    print(
        f"\npaused: process CPU / wall {sum(cpu) / sum(wall):.4f} (max {max(c / w for c, w in zip(cpu, wall)):.4f}), "
        f"engine thread {sum(engine_cpu) / sum(wall):.5f} (target < 0.01)"
    )
    ratio = statistics.median(resumed_rates) / statistics.median(free_rates)
    print(
        f"decode after resume {statistics.median(resumed_rates):.1f} tok/s vs free {statistics.median(free_rates):.1f}: "
        f"{ratio:.3f}x (medians; per round {min(b / a for a, b in zip(free_rates, resumed_rates)):.3f}–"
        f"{max(b / a for a, b in zip(free_rates, resumed_rates)):.3f}) (target >= 0.97)"
    )
    print(
        f"median pass after resume {statistics.median(resumed_pass):.2f} ms vs free {statistics.median(free_pass):.2f}: "
        f"free / resumed {statistics.median(free_pass) / statistics.median(resumed_pass):.3f}x (per round "
        f"{min(a / b for a, b in zip(free_pass, resumed_pass)):.3f}–{max(a / b for a, b in zip(free_pass, resumed_pass)):.3f})"
    )


if __name__ == "__main__":
    main()
