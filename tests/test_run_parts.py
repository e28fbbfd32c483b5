"""The reply run's collaborators (engine/run.py), each on its own and without a model: step
mode (StepGate) on a logits row the real default model gave (tests/data/run_logits.npz),
the live settings (ReplySettings), a branch (Branch), the thread tuner's record per pass
(PassThreads), the reply's text (ReplyText)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from replay_host import LOGITS

from loopchat.engine.branch import Branch
from loopchat.engine.pass_threads import PassThreads
from loopchat.engine.reply_text import ReplyText
from loopchat.engine.run_settings import ReplySettings
from loopchat.engine.sampler import make_rng, sample
from loopchat.engine.step_gate import Drawn, PendingDraw, StepGate
from loopchat.engine.thread_tuner import ThreadTuner
from loopchat.errors import EngineError
from loopchat.events import Message, Pending
from loopchat.request import ReplyRequest
from loopchat.settings import LiveSettings, SamplingSettings
from loopchat.step_control import HAND, SAMPLED, STEPPED, DecisionKind, StepControl

S1 = SamplingSettings(temperature=0.8, top_k=40, top_p=0.95, seed=5)
S2 = S1.replace(temperature=1.5, top_k=0)
CONTEXT = [1, 2, 3]
WAIT = 30.0


@pytest.fixture(scope="module")
def row() -> np.ndarray:
    return np.load(LOGITS)["rows"][0]


def show(res, settings, sample_ms) -> Pending:  # the Pending a run would make (its numbers only)
    return Pending(0, (), (), res.raw_entropy, res.sampled_entropy, res.kept, 0.0, 1, sample_ms, settings, 0)


def held(gate: StepGate, row: np.ndarray, settings: ReplySettings, on_pending: Callable[[Pending], None]):
    """Run gate.hold to its end on this thread: (the Pendings it showed, the draw it returned)."""
    draw = PendingDraw(row, CONTEXT, 10, row.shape[0], show)
    hold = gate.hold(draw, settings, 0.0)
    shown: list[Pending] = []
    try:
        while True:
            shown.append(next(hold))
            on_pending(shown[-1])
    except StopIteration as stop:
        return shown, stop.value


def test_a_step_after_a_reshape_draws_what_a_free_run_under_the_new_settings_draws(row) -> None:
    live = LiveSettings(S1)
    settings = ReplySettings(live, reply_seed=0)
    control = StepControl(paused=True)
    gate = StepGate(control, lambda: False)
    actions = [lambda: live.set(S2), lambda: control.step(1)]
    shown, drawn = held(gate, row, settings, lambda p: actions.pop(0)())
    free_s1 = sample(row, CONTEXT, S1, make_rng(5), 10)
    free = make_rng(5)
    free_s2 = sample(row, CONTEXT, S2, free, 10)
    assert [p.settings for p in shown] == [S1, S2]
    assert shown[0].sampled_entropy == free_s1.sampled_entropy and shown[1].sampled_entropy == free_s2.sampled_entropy
    assert isinstance(drawn, Drawn) and drawn.chosen_by == STEPPED
    assert drawn.result.token_id == free_s2.token_id and drawn.result.sampled_prob == free_s2.sampled_prob
    assert settings.rng.random() == free.random()  # one draw taken from the seed's stream, not two
    assert gate.probe is None  # nothing pending once the draw is decided


def test_a_hand_pick_takes_the_token_and_leaves_the_generator_as_it_was(row) -> None:
    settings = ReplySettings(LiveSettings(S1), reply_seed=0)
    control = StepControl(paused=True)
    gate = StepGate(control, lambda: False)
    picked = int(np.argsort(row)[-7])  # the 7th most likely token

    def pick(p: Pending) -> None:
        assert gate.probe is not None and gate.probe[2] == S1  # what pending_probs reads
        control.pick(picked)

    shown, drawn = held(gate, row, settings, pick)
    forced = sample(row, CONTEXT, S1, make_rng(5), 10, force=picked)
    assert len(shown) == 1 and drawn.chosen_by == HAND and drawn.result.token_id == picked
    assert drawn.result.raw_prob == forced.raw_prob and drawn.result.raw_rank == 7
    assert settings.rng.random() == make_rng(5).random()  # the preview's draw was undone


def test_a_pick_outside_the_vocabulary_keeps_waiting_and_a_cancel_ends_the_wait(row) -> None:
    settings = ReplySettings(LiveSettings(S1), reply_seed=0)
    control = StepControl(paused=True)
    cancelled = threading.Event()
    gate = StepGate(control, cancelled.is_set)

    def cancel() -> None:
        cancelled.set()
        control.wake()

    def pick_outside(p: Pending) -> None:
        control.pick(row.shape[0] + 5)
        threading.Timer(0.2, cancel).start()  # the wait goes on after the pick, until this

    shown, drawn = held(gate, row, settings, pick_outside)
    assert len(shown) == 1 and drawn is None and gate.probe is None


def test_resumed_draws_are_sampled_and_granted_ones_are_steps() -> None:
    control = StepControl(paused=True)
    gate = StepGate(control, lambda: False)
    control.step(2)
    assert not gate.stops() and gate.credit() == STEPPED
    assert not gate.stops() and gate.credit() == STEPPED
    assert gate.stops()
    control.resume()
    assert not gate.stops() and gate.credit() == SAMPLED
    assert control.wait(lambda: False, lambda: False).kind is DecisionKind.DRAW
    assert StepGate(None, lambda: False).credit() == SAMPLED and not StepGate(None, lambda: False).stops()


def test_reply_settings_resolve_the_seed_once_and_reseed_only_when_it_changes() -> None:
    live = LiveSettings(S1.replace(seed=None))
    s = ReplySettings(live, reply_seed=77)
    assert s.now.seed == 77 and s.refresh() is s.now
    first = s.rng
    live.update(temperature=0.3)  # a new object, the same (unpinned) seed: the same generator
    assert s.moved() and s.refresh().temperature == 0.3 and s.rng is first and not s.moved()
    assert s.changed() == ()  # nothing recorded yet
    s.recorded()
    live.update(seed=9)
    assert s.refresh().seed == 9 and s.rng is not first and s.changed() == ("seed",)


def test_a_branch_takes_its_first_token_once_and_refuses_tokens_outside_the_vocabulary() -> None:
    request = ReplyRequest((Message("user", "hi"),), S1, reply_prefix=(5, 6, 7), first_token=9)
    b = Branch.of(request, n_vocab=10)
    assert (b.base, b.given(0), b.given(1)) == (3, 9, None)
    assert Branch.of(request.with_(first_token=None), 10).given(0) is None
    # forced: the tokens of the steps after the first token (or from the first, without one)
    forced = Branch.of(request.with_(forced=(1, 2)), 10)
    assert [forced.given(i) for i in range(4)] == [9, 1, 2, None]
    assert [Branch.of(request.with_(first_token=None, forced=(4,)), 10).given(i) for i in (0, 1)] == [4, None]
    # a forced run ends with its last given token, whatever max_tokens says; others at max_tokens
    assert [forced.ends(n, max_tokens=1) for n in (2, 3)] == [False, True]
    assert forced.ends(3, max_tokens=99)
    assert [b.ends(n, max_tokens=5) for n in (1, 2)] == [False, True]
    for bad in (request.with_(reply_prefix=(5, 10)), request.with_(first_token=-1), request.with_(forced=(3, 10))):
        with pytest.raises(EngineError, match="not of this model's vocabulary"):
            Branch.of(bad, n_vocab=10)


def test_pass_threads_record_a_reason_on_the_first_step_and_where_it_or_the_count_changes() -> None:
    tuner = ThreadTuner(2)
    p = PassThreads(tuner, tuner.threads)
    assert p.reason_to_record() == tuner.reason != ""
    p.before_pass()
    p.after_pass(tuner.threads, 0.0)
    assert p.reason_to_record() == ""  # the same count, the same reason
    p.after_pass(tuner.threads + 1, 12.5)  # another count (a probe): its reason again
    assert p.reason_to_record() == tuner.reason and p.cut_ms == 12.5
    assert PassThreads(None, 1).reason_to_record() == ""


def test_reply_text_gives_a_split_character_to_the_token_that_completes_it_and_holds_back_a_stop() -> None:
    t = ReplyText(stop=("END",))
    assert t.feed(b"caf\xc3", ending=False) == ("caf", False)
    assert t.feed(b"\xa9 E", ending=False) == ("\u00e9 ", False)  # "E" may begin the stop string
    assert t.feed(b"ND!", ending=False) == ("", True)
    assert t.close() == "caf\u00e9 "
    unfinished = ReplyText(prefix=b"\xe2\x82")  # a branch whose prefix began a character
    assert unfinished.feed(b"\xac", ending=False) == ("\u20ac", False)
    assert unfinished.feed(b"\xe2", ending=True) == ("\ufffd", False)
    assert unfinished.feed(None, ending=True) == ("", False)
