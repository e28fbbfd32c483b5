"""Speculative decoding in the engine (issue 25, item 1): verifying passes draw exactly as
the plain loop draws, every step is a full Step from its own row, and the pass fields are
recorded (trace, history).

Built as the Makefile builds llama-cpp-python (its patch: F16 matmuls through vec_dot), llama.cpp's logits on the
default model do not depend on how many positions a pass holds (tests/test_batch_invariance.py):
a verifying pass's rows are the one-position passes' bit for bit, so at temperature 0, or under
one seed, a speculative reply is the plain loop's reply, every step's distributions the same.
(The stock build's tinyBLAS gave passes of 2+ positions other rounding: the code rename below
parted from the plain loop at its token 45 under lookup, 40 under a draft model.)
"""

from __future__ import annotations

import math
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from loopchat.engine.draft_model import open_draft_model
from loopchat.engine.draft_pace import DraftPace
from loopchat.engine.drafts import LookupDrafter
from loopchat.engine.engine import Engine
from loopchat.errors import ModelLoadError
from loopchat.event_json import event_from_json_dict, to_json_dict
from loopchat.events import Finish, Message, Start, Step
from loopchat.history.step_codec import decode_steps, encode_steps
from loopchat.pass_lines import draft_summary, pass_figures, pass_line
from loopchat.settings import SamplingSettings

TEXT = (
    "Speculative decoding lets a model check several guessed tokens in one forward pass. "
    "Each guess is kept only when the model would have drawn it anyway, so the text does not change. "
    "The guesses come from the context itself: a phrase seen before is likely to be followed by what followed it then."
)
REPEAT = [Message("user", "Repeat the following text exactly: " + TEXT)]
#: a copying model: no penalty pushing it off the text it repeats
COPY = SamplingSettings(temperature=0.0, repeat_penalty=1.0, dry_multiplier=0.0, max_tokens=90)


def _reply(engine: Engine, messages: list[Message], settings: SamplingSettings) -> tuple[Start, list[Step], Finish]:
    """One reply's events. The prompt's KV cache serves it as far as it holds the same tokens
    (the engine's default reuse: all but the last token, fed alone): on this build a pass's rows
    do not depend on how many positions it holds (tests/test_batch_invariance.py), so a reused
    cache is the one a fresh prefill gives, bit for bit. (Each test's first reply evaluated its
    prompt afresh, `reuse_at_most=0`: REPEAT's 95 tokens are ~0.8 s of CPU; three of the four
    tests that begin with it now find it in the cache, the tests in this file's order.)"""
    events = list(engine.generate(messages, settings))
    start = next(e for e in events if isinstance(e, Start))
    return start, [e for e in events if isinstance(e, Step)], next(e for e in events if isinstance(e, Finish))


@pytest.mark.model
def test_lookup_at_temperature_0_gives_the_plain_loop_s_text_in_fewer_passes(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the pace drafts as many as lookup offers at every pass: the length it would choose follows
    # the passes' measured costs, which a loaded machine moves (8 kept in a clean clone's suite)
    monkeypatch.setattr(DraftPace, "length", lambda self, room: max(0, min(self.draft_max, room)))
    _, plain, f0 = _reply(engine, REPEAT, COPY)
    start, spec, f1 = _reply(engine, REPEAT, COPY.replace(draft="lookup"))  # the prompt's cache
    assert start.settings.draft == "lookup" and all(s.pass_report is None for s in plain)
    figures = pass_figures(spec)
    assert figures.kept > 10 and figures.passes < figures.tokens, draft_summary(figures)  # it drafted, and kept
    assert [s.token_id for s in spec] == [s.token_id for s in plain] and f1.text == f0.text
    # each verifying pass's steps: its drafts kept in order, then (unless the reply ended) one drawn
    for number in {s.pass_report.number for s in spec if s.pass_report}:
        group = [s for s in spec if s.pass_report and s.pass_report.number == number]
        report = group[0].pass_report
        assert all(s.pass_report == report for s in group) and len(group) == report.tokens
        assert [s.drafted for s in group] == [True] * report.kept + [False] * int(report.drawn)
        assert report.source == "lookup" and 1 <= report.drafted <= COPY.draft_max and report.ms > 0
        assert group[0].forward_ms == report.ms and group[0].forward_tokens == report.drafted + 1
        assert all(s.forward_ms == 0.0 and s.forward_tokens == 0 for s in group[1:])
        assert [s.index for s in group] == list(range(group[0].index, group[0].index + len(group)))
        assert (group[-1].rejected is not None) == (report.drawn and report.kept < report.drafted)
    assert pass_line(report).startswith(f"pass {report.number} · checked {report.drafted} drafted token")


def _fresh_rows(model_path: Path, prompt: list[int], steps: list[Step]) -> list[np.ndarray]:
    """The logits behind each step from a separate context (llama-cpp-python's own Llama), as the
    plain loop reads them: the prompt whole, then each step's token fed alone, one position a pass."""
    ref = llama_cpp.Llama(str(model_path), n_ctx=1024, n_threads=1, flash_attn=False, verbose=False)
    n_vocab, rows = ref.n_vocab(), []
    try:
        ref.eval(prompt)
        for step in steps:
            rows.append(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ref.ctx, -1), shape=(n_vocab,)).copy())
            ref.eval([step.token_id])
        return rows
    finally:
        ref.close()


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z.astype(np.float64) - z.max())
    return e / e.sum()


@pytest.mark.model
def test_every_step_of_a_sampled_speculative_reply_is_a_fresh_evaluation_of_its_prefix(
    engine: Engine, model_path: Path
) -> None:
    """Each step's probabilities against softmax of a one-position pass's row of its prefix in
    another context, to float32's rounding of the probabilities (1e-6; 1e-4 before the wheel
    was batch-invariant, and then against rows batched as the verifying passes were)."""
    settings = COPY.replace(temperature=0.6, top_k=0, top_p=1.0, min_p=0.0, seed=3, max_tokens=60, draft="lookup")
    start, spec, _ = _reply(engine, REPEAT, settings)
    assert start.flash_attn == "off" and any(s.drafted for s in spec) and any(s.rejected for s in spec)
    rows = _fresh_rows(model_path, list(start.prompt_token_ids), spec)
    assert len(rows) == len(spec)
    for step, z in zip(spec, rows, strict=True):
        p, q = _softmax(z), _softmax(z / settings.temperature)  # (no filter on: q is what was drawn from)
        assert [c.prob for c in step.raw_top] == pytest.approx(p[[c.token_id for c in step.raw_top]], abs=1e-6)
        assert step.raw_prob == pytest.approx(p[step.token_id], abs=1e-6), step.index
        assert step.sampled_prob == pytest.approx(q[step.token_id], abs=1e-6), step.index
        if step.rejected is not None:  # the refused guess: its probabilities at the same row
            assert step.rejected.raw_prob == pytest.approx(p[step.rejected.token_id], abs=1e-6)
            assert step.rejected.sampled_prob == pytest.approx(q[step.rejected.token_id], abs=1e-6)
            assert step.rejected.token_id != step.token_id


def _same_steps(plain: list[Step], spec: list[Step]) -> None:
    """The same tokens, and at every step the same raw and sampled distributions, bit for bit."""
    assert [s.token_id for s in spec] == [s.token_id for s in plain]
    for a, b in zip(plain, spec, strict=True):
        assert (b.raw_top, b.sampled_top, b.raw_prob, b.sampled_prob) == (
            a.raw_top,
            a.sampled_top,
            a.raw_prob,
            a.sampled_prob,
        ), b.index


@pytest.mark.model
def test_with_sampling_and_a_seed_the_draft_does_not_change_the_reply(engine: Engine) -> None:
    settings = COPY.replace(temperature=1.0, seed=11, max_tokens=80)
    _, plain, _ = _reply(engine, REPEAT, settings)
    _, spec, _ = _reply(engine, REPEAT, settings.replace(draft="lookup"))  # the prompt's cache
    assert pass_figures(spec).kept > 0
    _same_steps(plain, spec)


@pytest.mark.model
def test_the_pass_fields_survive_the_trace_and_the_history(engine: Engine) -> None:
    # (here, after the tests above: the engine's cache holds REPEAT's prompt for its reply)
    _, spec, _ = _reply(engine, REPEAT, COPY.replace(max_tokens=40, draft="lookup"))
    assert any(s.pass_report for s in spec) and any(s.drafted for s in spec)
    assert [event_from_json_dict(to_json_dict(s)) for s in spec] == spec
    assert decode_steps(encode_steps(spec)) == spec
    plain = [s for s in spec if s.pass_report is None]
    assert all("pass_report" not in to_json_dict(s) for s in plain)  # a plain step's trace is as before


#: benchmarks/speculative.py's code rename, cut to 60 tokens: on the stock wheel (tinyBLAS) it
#: parted from the plain loop at token 45 under lookup and 40 under the model as its own draft
CODE = "\n".join(
    ["def summarize(values, limit):", "    x = 0"]
    + [f"    if values[{i}] > limit:\n        x = x + values[{i}]\n    else:\n        x = x - 1" for i in range(14)]
    + ["    return x"]
)
RENAME = [Message("user", "Rename the variable x to count in this code:\n```python\n" + CODE + "\n```")]


@pytest.mark.model
def test_a_copy_of_the_model_as_its_draft_model_has_its_drafts_kept(engine: Engine, model_path: Path) -> None:
    """At temperature 0, lookup and the model as its own draft model give the plain loop's reply,
    every step's distributions bit for bit; the draft model (the same logits, one position a
    pass) has every draft kept. The plain reply evaluates the 462-token prompt; the two
    speculative replies reuse its KV cache (the engine's default: all but its last token, fed
    alone), a third of the test's CPU each when evaluated again: the logits do not depend on
    how many positions a pass holds (tests/test_batch_invariance.py), so the cache the plain
    reply's prefill left is the one a fresh prefill would give, bit for bit."""
    settings = COPY.replace(max_tokens=60)
    _, plain, _ = _reply(engine, RENAME, settings)
    _, lookup, _ = _reply(engine, RENAME, settings.replace(draft="lookup"))
    engine.draft_model = open_draft_model(engine, model_path)
    try:
        _, spec, _ = _reply(engine, RENAME, settings.replace(draft="model"))
    finally:
        engine.draft_model.close()
        engine.draft_model = None
    for steps, source in ((lookup, "lookup"), (spec, "model")):
        figures = pass_figures(steps)
        assert figures.kept > 0 and {s.pass_report.source for s in steps if s.pass_report} == {source}
        _same_steps(plain, steps)
    figures = pass_figures(spec)
    assert figures.kept == figures.drafted and not any(s.rejected for s in spec), draft_summary(figures)


@pytest.mark.model
def test_a_draft_model_with_another_vocabulary_is_refused_in_one_line(engine: Engine, gemma_path: Path) -> None:
    with pytest.raises(ModelLoadError) as err:
        open_draft_model(engine, gemma_path)
    message = str(err.value)
    assert "\n" not in message and "vocabulary" in message and "262,144" in message, message
    assert engine.draft_model is None


def _chi_square_p(stat: float, df: int) -> float:
    """The chi-square distribution's upper tail (the regularized upper incomplete gamma Q(df/2, stat/2))."""
    a, x = df / 2.0, stat / 2.0
    term = total = 1.0 / a
    for n in range(1, 10_000):
        term *= x / (a + n)
        total += term
        if term < total * 1e-15:
            break
    return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - math.lgamma(a))) if x > 0 else 1.0


#: a text the default model copies for a few hundred tokens (the calibration's replies)
LIGHTHOUSE = (
    "The lighthouse keeper climbed the stairs every evening at six. He lit the lamp, wiped the glass, and wrote the "
    "weather in his book. On calm nights the sea was silver and the ships passed far away. On stormy nights the waves "
    "broke against the rocks and the wind howled around the tower. In the morning he put out the lamp, ate his bread "
    "and cheese, and slept until noon. Then he mended the nets, painted the railings, and fed the gulls that waited on "
    "the roof. Once a year a boat brought oil, flour, letters and news from the town."
)


@pytest.mark.model
@pytest.mark.slow
def test_speculative_draws_are_calibrated_against_their_step_records(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drawn token's frequency per bin of the probability the step recorded for it
    (each candidate of sampled_top: its probability, and whether it was drawn), over >= 2,000
    steps that verifying passes gave: chi-square p > 0.001. The pace drafts 3 tokens at
    every pass here (it would back off where drafts fail: those passes are what is tested)."""
    monkeypatch.setattr(DraftPace, "length", lambda self, room: max(0, min(3, room)))
    settings = COPY.replace(temperature=0.7, max_tokens=400, draft="lookup")
    edges = np.array([0.0, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85, 0.95, 1.0001])
    expected, observed, variance = np.zeros(10), np.zeros(10), np.zeros(10)
    n_steps = 0
    prompt = [Message("user", "Repeat the following text exactly: " + LIGHTHOUSE)]
    for seed in range(30):
        if n_steps >= 2000:
            break
        # the prompt's KV cache is kept from one seed to the next (the engine's default reuse;
        # a fresh prefill (reuse_at_most=0) would evaluate the same prompt again for every seed: a fifth
        # of the test's CPU). The steps read here are the verifying passes', after the prefill.
        # The last reply is closed once 2,000 steps are counted (a stop, as Esc's): its
        # remaining tokens would be read by nothing.
        reply = engine.generate(prompt, settings.replace(seed=100 + seed))
        for s in reply:
            if not isinstance(s, Step) or s.pass_report is None:
                continue
            if n_steps >= 2000:
                reply.close()
                break
            n_steps += 1
            for c in s.sampled_top:
                b = int(np.searchsorted(edges, c.prob, side="right")) - 1
                expected[b] += c.prob
                variance[b] += c.prob * (1 - c.prob)
                observed[b] += c.token_id == s.token_id
    assert n_steps >= 2000, n_steps
    used = variance > 1.0
    stat = float((((observed - expected) ** 2)[used] / variance[used]).sum())
    p = _chi_square_p(stat, int(used.sum()))
    assert used.sum() >= 5 and p > 0.001, (p, observed.round(), expected.round(1))


def test_prompt_lookup_proposes_what_followed_the_longest_earlier_n_gram() -> None:
    lookup = LookupDrafter()
    assert lookup.propose([5, 6, 7, 8, 9, 1, 6, 7], 3) == [8, 9, 1]  # (7 8 9 after "6 7")
    assert lookup.propose([1, 2, 3, 9, 2, 3], 2) == [9, 2]  # one earlier occurrence: what followed it
    assert lookup.propose([2, 3, 9, 8, 2, 3, 9, 7, 2, 3], 3) == [9]  # two: as far as they agree
    assert lookup.propose([1, 2, 3, 4, 2, 3, 9, 2, 3], 2) == []  # they part at once: no draft
    agreeing = [2, 3, 0, 5, 2, 3, 1, 5, 2, 3, 9, 5, 2, 3, 9, 5, 2, 3, 9, 5, 2, 3, 9, 5, 2, 3]
    assert lookup.propose(agreeing, 2) == [9, 5]  # only the latest 4 occurrences must agree
    assert lookup.propose([1, 2, 3, 4], 4) == []  # nothing repeats: no draft
    assert lookup.propose([4, 1, 2, 7, 1, 2], 8) == [7, 1, 2]  # up to the context's end


def test_the_draft_length_follows_the_measured_costs_and_acceptance() -> None:
    pace = DraftPace(8)
    assert pace.length(8) == 0  # no plain pass measured yet
    pace.plain(10.0)
    first = pace.length(8)
    assert first >= 2  # the prior: a first try is a real one
    for _ in range(6):  # every draft kept, each position 3 ms more: longer drafts pay
        pace.verified(first, first, 10.0 + 3.0 * first, 0.0)
    assert pace.length(8) == 8 and pace.length(3) == 3
    chosen = []
    while (k := pace.length(8)) > 0 and len(chosen) < 30:  # every first draft refused: shorter, then none
        chosen.append(k)
        pace.verified(k, 0, 10.0 + 3.0 * k, 0.0)
    assert k == 0 and chosen == sorted(chosen, reverse=True) and len(chosen) < 20, chosen
    lengths = [pace.length(8) for _ in range(200)]
    assert 1 in lengths and lengths.count(0) > 190  # backed off, with a one-draft probe now and then


@pytest.mark.model
def test_a_speculative_reply_s_replay_gives_its_tokens(engine: Engine) -> None:
    """F9 on a speculative reply (chat/replay_check.py): the same messages, settings (the
    draft included) and seed, and the same draft lengths at the same passes (the request's
    draft_plan: the pace's choice depends on the machine's timing), through the engine
    again: the same passes, the same logits, the same tokens, and the replay check says so."""
    from test_session import READY, Backend

    from loopchat.chat.conversation import STREAM
    from loopchat.chat.replay_check import check_replay, replay_verdict
    from loopchat.chat.session import ChatSession
    from loopchat.events import RunDone

    class Requests(Backend):
        def generate(self, request):
            self.requests = [*getattr(self, "requests", []), request]
            return super().generate(request)

    session = ChatSession(Requests())
    session.consume([READY])
    session.change_settings(**{k: getattr(COPY, k) for k in ("temperature", "repeat_penalty", "dry_multiplier")})
    session.change_settings(draft="lookup", max_tokens=60)
    session.send("Repeat the following text exactly: " + TEXT, STREAM)
    for run in (1, 2):
        request = session.backend.requests[run - 1].with_(reuse_at_most=0)
        session.consume([*engine.run_reply(request), RunDone(run)])
        if run == 1:
            original = session.last_done_reply()
            replay = session.replay_other_mode()
    plan = session.backend.requests[1].draft_plan
    assert plan == tuple({s.pass_report.number: s.pass_report.drafted for s in original.steps if s.pass_report}.items())
    assert plan and any(s.drafted for s in original.steps)
    assert [s.pass_report for s in replay.steps if s.pass_report] != []
    assert [s.token_id for s in replay.steps] == [s.token_id for s in original.steps]
    assert [(s.pass_report.number, s.pass_report.kept) for s in replay.steps if s.pass_report] == [
        (s.pass_report.number, s.pass_report.kept) for s in original.steps if s.pass_report
    ]
    assert [s.raw_top for s in replay.steps] == [s.raw_top for s in original.steps]  # bit for bit
    assert check_replay(replay, session.conversation) is None  # nothing to say: the same
    assert (
        replay_verdict(replay, original)
        == f"same tokens as reply {original.number} ({sum(not s.is_stop for s in replay.steps)})"
    )
