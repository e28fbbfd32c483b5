"""Both engine hosts (a thread, a child process) behave the same from outside."""

from __future__ import annotations

import queue
from pathlib import Path

import pytest

from loopchat.engine.options import EngineOptions
from loopchat.engine.process_worker import ProcessEngineWorker
from loopchat.engine.worker import EngineWorker
from loopchat.events import Finish, FinishReason, Message, ModelReady, RunDone, Step, WorkerError
from loopchat.request import ReplyRequest
from loopchat.settings import LiveSettings, SamplingSettings

pytestmark = pytest.mark.model

MESSAGES = (Message("system", "You are a helpful assistant."), Message("user", "List five animals."))


def collect_until(q: queue.Queue, kind: type, timeout: float = 120) -> list:
    out = []
    while True:
        event = q.get(timeout=timeout)
        out.append(event)
        if isinstance(event, kind):
            return out


def started(kind: str, put, model_path: Path) -> EngineWorker | ProcessEngineWorker:
    """A host of `kind` ("thread" or "process") with the default model loaded."""
    w = (EngineWorker if kind == "thread" else ProcessEngineWorker)(put)
    w.load(EngineOptions(str(model_path), n_ctx=1024, threads=1), "smollm2", model_path)
    return w


@pytest.fixture(scope="module", params=["thread", "process"])
def host(request, model_path: Path):
    """One host of each kind for the module (a process host's start and load took 3-6 s of
    set-up on a busy machine); its events go to the queue of the test in hand."""
    sink: list[queue.Queue] = [queue.Queue()]
    w = started(request.param, lambda event: sink[0].put(event), model_path)
    ready = collect_until(sink[0], (ModelReady, WorkerError))[-1]
    assert isinstance(ready, ModelReady), ready
    yield w, sink
    w.close()


@pytest.fixture(params=["thread", "process"])
def fresh_worker_and_queue(request, model_path: Path):
    """A host of its own: a host that has run replies may answer the same request from its
    KV cache, and its logits then differ in the last bits from a fresh engine's."""
    q: queue.Queue = queue.Queue()
    w = started(request.param, q.put, model_path)
    ready = collect_until(q, (ModelReady, WorkerError))[-1]
    assert isinstance(ready, ModelReady), ready
    yield w, q
    w.close()


@pytest.fixture
def worker_and_queue(host):
    """The module's host with a fresh queue: each test below reads its runs to RunDone."""
    w, sink = host
    assert not w.busy, "the test before left a run going"
    sink[0] = queue.Queue()
    yield w, sink[0]


def test_generate_with_a_live_settings_change(worker_and_queue) -> None:
    w, q = worker_and_queue
    live = LiveSettings(SamplingSettings(seed=11, max_tokens=24, temperature=1.0, repeat_penalty=1.0))
    w.generate(ReplyRequest(MESSAGES, live.get()), live=live)
    assert w.busy
    steps: list[Step] = []
    changed_at = None
    while True:
        event = q.get(timeout=120)
        if isinstance(event, Step):
            steps.append(event)
            if event.index == 3:
                live.update(temperature=0.0)
        if isinstance(event, RunDone):
            break
    change = [s.index for s in steps if s.settings_changed == ("temperature",)]
    assert len(change) == 1
    changed_at = change[0]
    assert changed_at >= 4
    assert all(s.settings.temperature == 0.0 for s in steps[changed_at:])
    assert all(s.settings.temperature == 1.0 for s in steps[:changed_at])
    assert not w.busy


def test_same_tokens_from_either_host(fresh_worker_and_queue, model_path: Path) -> None:
    w, q = fresh_worker_and_queue
    s = SamplingSettings(seed=5, max_tokens=20, temperature=0.8)
    w.generate(ReplyRequest(MESSAGES, s))
    events = collect_until(q, RunDone)
    finish = next(e for e in events if isinstance(e, Finish))
    # reference: the engine driven directly in this thread
    from loopchat.engine.engine import Engine

    with Engine(model_path, n_ctx=1024, threads=1) as eng:
        ref = [e for e in eng.generate(MESSAGES, s) if isinstance(e, Finish)][0]
    assert finish.text == ref.text


def test_cancel_and_go_on(worker_and_queue) -> None:
    w, q = worker_and_queue
    w.generate(ReplyRequest(MESSAGES, SamplingSettings(max_tokens=500, seed=1)))
    while True:
        event = q.get(timeout=120)
        if isinstance(event, Step):
            w.cancel()
            break
    finish = collect_until(q, Finish)[-1]
    assert finish.reason == FinishReason.CANCELLED
    collect_until(q, RunDone)
    w.generate(ReplyRequest(MESSAGES, SamplingSettings(max_tokens=3, seed=1)))
    assert collect_until(q, Finish)[-1].reason in (FinishReason.LENGTH, FinishReason.STOP)
    collect_until(q, RunDone)


@pytest.mark.parametrize("cls", [EngineWorker, ProcessEngineWorker])
def test_a_bad_model_is_a_worker_error_not_a_crash(cls, tmp_path: Path, model_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    q: queue.Queue = queue.Queue()
    w = cls(q.put)
    try:
        w.load(EngineOptions(str(bad)), "bad", bad)
        err = collect_until(q, (WorkerError, ModelReady))[-1]
        assert isinstance(err, WorkerError) and err.during == "load"
        assert "bad.gguf" in err.message and "\n" not in err.message
        w.generate(ReplyRequest(MESSAGES, SamplingSettings(max_tokens=2)))
        err2 = collect_until(q, WorkerError)[-1]
        assert "no model" in err2.message
        # and a good model loads afterwards in the same worker
        w.load(EngineOptions(str(model_path), n_ctx=512, threads=1), "ok", model_path)
        assert isinstance(collect_until(q, (ModelReady, WorkerError))[-1], ModelReady)
    finally:
        w.close()


def test_a_crashed_engine_process_is_reported_and_can_be_restarted(model_path: Path) -> None:
    import os
    import signal

    q: queue.Queue = queue.Queue()
    w = ProcessEngineWorker(q.put)
    try:
        w.load(EngineOptions(str(model_path), n_ctx=512, threads=1), "m", model_path)
        assert isinstance(collect_until(q, (ModelReady, WorkerError))[-1], ModelReady)
        w.generate(ReplyRequest(MESSAGES, SamplingSettings(max_tokens=400, seed=1)))
        while not isinstance(q.get(timeout=60), Step):
            pass
        os.kill(w._proc.pid, signal.SIGKILL)  # as a segfault in llama.cpp would end it
        err = collect_until(q, WorkerError)[-1]
        assert "stopped unexpectedly" in err.message
        collect_until(q, RunDone)
        assert not w.busy and not w.alive
        w.generate(ReplyRequest(MESSAGES, SamplingSettings(max_tokens=2)))
        assert "not running" in collect_until(q, WorkerError)[-1].message
        w.load(EngineOptions(str(model_path), n_ctx=512, threads=1), "m", model_path)
        assert isinstance(collect_until(q, (ModelReady, WorkerError))[-1], ModelReady)
        w.generate(ReplyRequest(MESSAGES, SamplingSettings(max_tokens=3, seed=1)))
        assert collect_until(q, Finish)[-1].reason in (FinishReason.LENGTH, FinishReason.STOP)
    finally:
        w.close()


def test_a_paced_reader_keeps_the_order_and_flush_hands_over_at_once(model_path: Path) -> None:
    import threading
    from multiprocessing.connection import wait

    q: queue.Queue = queue.Queue()
    # after its first read the reader thread waits an hour: what follows comes by flush()
    w = ProcessEngineWorker(lambda e: q.put((threading.current_thread(), e)), read_period=3600)
    try:
        w.load(EngineOptions(str(model_path), n_ctx=512, threads=1), "m", model_path)
        w.generate(ReplyRequest(MESSAGES, SamplingSettings(max_tokens=12, seed=3)))
        got: list = []
        while not got or not isinstance(got[-1][1], RunDone):
            assert wait([w._events], timeout=120), "no event from the engine in 2 minutes"
            w.flush()
            while not q.empty():
                got.append(q.get_nowait())
        events = [e for _, e in got]
        kinds = [type(e).__name__ for e in events]
        assert kinds[-4:] == ["Step", "Step", "Finish", "RunDone"], kinds
        ready = kinds.index("ModelReady")
        assert kinds[ready + 1 : ready + 3] == ["Start", "Prefill"], kinds
        steps = [e for e in events if isinstance(e, Step)]
        assert [s.index for s in steps] == list(range(len(steps))) and len(steps) > 2
        # the reader thread handed over one batch (what had arrived when it first woke:
        # on a busy machine it may wake after a flush() and its batch may hold the run's
        # Start, or nothing) and then slept: its events are one contiguous run, and every event after
        # them came by flush(), on this thread, the run's end among them
        me = threading.current_thread()
        # (when a flush() came first, its one batch may be empty)
        by_reader = [i for i, (thread, _) in enumerate(got) if thread is not me]
        if by_reader:
            assert by_reader == list(range(by_reader[0], by_reader[-1] + 1)), by_reader
            assert all(thread is me for thread, _ in got[by_reader[-1] + 1 :])
        assert got[-1][0] is me and got[-2][0] is me  # Finish and RunDone came by flush()
        assert w._reader.is_alive()  # still in its hour
    finally:
        w.close()
    assert not w._reader.is_alive()  # close() woke it


def test_an_unexpected_engine_error_comes_before_the_runs_end(worker_and_queue) -> None:
    # text the tokenizer cannot encode (a lone surrogate, as Python makes of a non-UTF-8
    # byte): an exception that is not an EngineError. `loopchat run` and the app stop
    # reading a run at RunDone, so the error must come first (it came after).
    w, q = worker_and_queue
    w.generate(ReplyRequest((Message("user", "caf\udce9"),), SamplingSettings(max_tokens=4, seed=1)))
    events = collect_until(q, RunDone)
    errors = [e for e in events if isinstance(e, WorkerError)]
    assert len(errors) == 1 and errors[0].during == "generate" and errors[0].internal
    assert events[-2] is errors[0]
    assert "internal error while generating" in errors[0].message and "\n" not in errors[0].message
    assert not w.busy
    # the worker goes on: the next run is a normal one
    w.generate(ReplyRequest(MESSAGES, SamplingSettings(max_tokens=3, seed=1)))
    events = collect_until(q, RunDone)
    assert isinstance(events[-2], Finish) and not any(isinstance(e, WorkerError) for e in events)
