"""Step mode in the engine (step_control.py): the loop stops before the draw, and the
user draws, reshapes the die, picks a token, resumes or cancels. Real model."""

from __future__ import annotations

import itertools
import queue
import threading
import time

import pytest

from loopchat.engine.engine import Engine
from loopchat.events import Finish, FinishReason, Message, Pending, Step
from loopchat.settings import LiveSettings, SamplingSettings
from loopchat.step_control import HAND, SAMPLED, STEPPED, StepControl

pytestmark = pytest.mark.model

MESSAGES = (Message("user", "Tell me a short story about a cat."),)
SETTINGS = SamplingSettings(temperature=1.0, top_k=40, top_p=0.95, min_p=0.0, seed=1234, max_tokens=10)
WAIT = 60.0


class Run:
    """engine.generate in a thread of its own; its events in a queue."""

    def __init__(self, engine: Engine, settings, control: StepControl | None) -> None:
        self.events: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, args=(engine, settings, control), daemon=True)
        self.thread.start()

    def _run(self, engine, settings, control) -> None:
        for e in engine.generate(MESSAGES, settings, control=control, reuse_at_most=0):
            self.events.put(e)
        self.events.put(None)

    def next(self, kind: type):
        """The next event of `kind` (the others before it are kept in `seen`)."""
        while True:
            e = self.events.get(timeout=WAIT)
            if e is None:
                raise AssertionError(f"the run ended before a {kind.__name__}")
            if isinstance(e, kind):
                return e

    def rest(self) -> list:
        out = []
        while (e := self.events.get(timeout=WAIT)) is not None:
            out.append(e)
        self.thread.join(WAIT)
        return out


def free_run(engine: Engine) -> list[Step]:
    return [e for e in engine.generate(MESSAGES, SETTINGS, reuse_at_most=0) if isinstance(e, Step)]


def test_single_steps_draw_what_a_free_run_draws(engine: Engine) -> None:
    free = free_run(engine)
    control = StepControl(paused=True)
    run = Run(engine, SETTINGS, control)
    draws = itertools.cycle([1, 3])  # one draw, then three at once, then one...
    steps: list[Step] = []
    stops = 0
    while (e := run.events.get(timeout=WAIT)) is not None:
        if isinstance(e, Pending):
            assert e.index == len(steps)
            stops += 1
            control.step(next(draws))
        elif isinstance(e, Step):
            steps.append(e)
    expected, at, grants = 0, 0, itertools.cycle([1, 3])
    while at < len(steps):  # the loop stopped wherever the granted draws ran out
        expected, at = expected + 1, at + next(grants)
    assert stops == expected and stops >= 3
    assert [s.token_id for s in steps] == [s.token_id for s in free]
    assert {s.chosen_by for s in steps} == {STEPPED}
    assert [s.sampled_prob for s in steps] == [s.sampled_prob for s in free]
    assert {s.chosen_by for s in free} == {SAMPLED}


def test_a_hand_picked_token_is_recorded_and_read_by_the_next_pass(engine: Engine) -> None:
    control = StepControl(paused=True)
    run = Run(engine, SETTINGS, control)
    pending = run.next(Pending)
    choice = pending.sampled_top[3]  # not the likeliest
    control.pick(choice.token_id)
    step = run.next(Step)
    assert step.chosen_by == HAND and step.token_id == choice.token_id
    assert step.sampled_prob == pytest.approx(choice.prob) and step.sampled_rank == 4
    raw = {c.token_id: c.prob for c in pending.raw_top}
    if choice.token_id in raw:
        assert step.raw_prob == pytest.approx(raw[choice.token_id])
    # a token the filters cut (the least likely of the vocabulary) can be picked too
    run.next(Pending)
    control.pick(engine.n_vocab - 1)
    cut = run.next(Step)
    assert cut.chosen_by == HAND and cut.token_id == engine.n_vocab - 1
    assert cut.sampled_prob == 0.0 and cut.sampled_rank == 0 and cut.raw_prob > 0.0
    control.resume()
    rest = run.rest()
    later = [e for e in rest if isinstance(e, Step)]
    assert later and {s.chosen_by for s in later} == {SAMPLED}
    finish = rest[-1]
    assert isinstance(finish, Finish)
    # the context the next passes read holds the picked tokens where they were picked
    prompt_len = step.n_past - 1
    ids = list(engine.llm.input_ids[: engine.llm.n_tokens])
    assert ids[prompt_len] == choice.token_id and ids[prompt_len + 1] == engine.n_vocab - 1


def test_a_setting_changed_while_stopped_reshapes_the_same_logits(engine: Engine) -> None:
    live = LiveSettings(SETTINGS)
    control = StepControl(paused=True)
    run = Run(engine, live, control)
    first = run.next(Pending)
    passes = engine.passes
    live.set(SETTINGS.replace(temperature=2.0, top_k=0, top_p=1.0))
    control.wake()
    reshaped = run.next(Pending)
    assert engine.passes == passes  # no forward pass for the reshape
    assert reshaped.index == first.index and reshaped.raw_top == first.raw_top
    assert reshaped.settings.temperature == 2.0 and reshaped.candidates_kept > first.candidates_kept
    assert reshaped.sampled_entropy > first.sampled_entropy
    control.step(1)
    step = run.next(Step)
    assert step.settings.temperature == 2.0 and step.sampled_top == reshaped.sampled_top
    assert step.candidates_kept == reshaped.candidates_kept
    engine.cancel()
    assert run.rest()[-1].reason == FinishReason.CANCELLED


def test_the_wait_costs_no_cpu_and_a_cancel_ends_it(engine: Engine) -> None:
    control = StepControl(paused=True)
    run = Run(engine, SETTINGS, control)
    run.next(Pending)
    engine_clock = time.pthread_getcpuclockid(run.thread.ident)  # the engine thread's own CPU time
    e0, c0, t0 = time.clock_gettime(engine_clock), time.process_time(), time.perf_counter()
    threading.Event().wait(2.0)
    e1, c1, t1 = time.clock_gettime(engine_clock), time.process_time(), time.perf_counter()
    cpu, engine_cpu, wall = c1 - c0, e1 - e0, t1 - t0
    assert control.waiting
    # the waiting thread burns nothing (a busy machine cannot fail this), and neither does
    # the process: no llama.cpp worker thread spins while the loop is stopped
    assert engine_cpu < 0.01 * wall, f"the engine thread used {engine_cpu:.4f} s of CPU in {wall:.2f} s while stopped"
    assert cpu < 0.05 * wall, f"{cpu:.3f} s of CPU in {wall:.2f} s while stopped"
    t = time.perf_counter()
    engine.cancel()
    finish = run.rest()[-1]
    assert finish.reason == FinishReason.CANCELLED and finish.steps == 0
    assert time.perf_counter() - t < 5.0


def test_pausing_a_running_loop_stops_before_its_next_draw(engine: Engine) -> None:
    control = StepControl()
    live = LiveSettings(SETTINGS.replace(max_tokens=200))
    run = Run(engine, live, control)
    first = run.next(Step)
    assert first.chosen_by == SAMPLED
    control.pause()
    pending = run.next(Pending)
    assert pending.index >= 1
    control.resume()
    rest = run.rest()
    steps = [e for e in rest if isinstance(e, Step)]
    assert steps[0].index == pending.index and {s.chosen_by for s in steps} == {SAMPLED}


def test_the_waits_are_left_out_of_ttft_and_decode_and_reported(engine: Engine) -> None:
    control = StepControl(paused=True)
    run = Run(engine, SETTINGS, control)
    events: list = []
    pendings = 0
    while (e := run.events.get(timeout=WAIT)) is not None:
        events.append(e)
        if isinstance(e, Pending):
            pendings += 1
            # the user looks at the die (the wait is what is measured), then draws two
            # tokens; at the next stop looks again and lets the loop run
            threading.Event().wait(0.3 if pendings == 1 else 0.2)
            control.step(2) if pendings == 1 else control.resume()
    run.thread.join(WAIT)
    finish = events[-1]
    steps = [e for e in events if isinstance(e, Step)]
    assert isinstance(finish, Finish) and pendings == 2 and finish.paused_ms >= 500
    # step 0's wall clock holds the first wait; the TTFT does not
    assert steps[0].elapsed_ms - finish.ttft_ms == pytest.approx(finish.paused_ms - 200, abs=100)
    assert steps[0].elapsed_ms - finish.ttft_ms >= 300
    # the decode time is the loop's: the second wait (~0.2 s) is not in it
    wall_decode = steps[-1].elapsed_ms - steps[0].elapsed_ms
    assert wall_decode - finish.decode_ms >= 200
    assert finish.total_ms >= finish.ttft_ms + finish.decode_ms + finish.paused_ms - 1
