"""Issue 24, item 3: a grammar or a JSON schema as a stage of the chain (llguidance's mask), on
the real default model: the replies follow it, and every figure the stage reports is
recomputed here from the pass's own logits (numpy, float64) and llguidance's mask from an
independent matcher; llama.cpp's own grammar sampler allows the same tokens at every step."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import llama_cpp
import numpy as np
import pytest
from llguidance import LLMatcher

from loopchat.constraint import Constraint, ConstraintError, read_constraint
from loopchat.engine.constraint_grammar import check
from loopchat.engine.sampler import make_rng, sample
from loopchat.events import Finish, FinishReason, Message, Step
from loopchat.settings import SamplingSettings

pytestmark = [pytest.mark.model, pytest.mark.filterwarnings("ignore:llama_token_get_attr:DeprecationWarning")]

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
ASK = [Message("user", "Reply with a JSON object.")]
#: a grammar whose first words are forced, then a choice (GBNF, llama.cpp's format)
GBNF = 'root ::= "The answer is " ("yes" | "no") "."\n'


def _reply(engine, constraint: Constraint, seed: int, max_tokens: int = 24) -> tuple[list[Step], Finish]:
    settings = SamplingSettings().replace(seed=seed, max_tokens=max_tokens, temperature=1.0)
    events = list(engine.generate(ASK, settings, constraint=constraint))
    return [e for e in events if isinstance(e, Step)], next(e for e in events if isinstance(e, Finish))


def test_json_schema_replies_parse_and_match_across_20_seeds(engine) -> None:
    c = Constraint("json_schema", json.dumps(SCHEMA), "test.json")
    for seed in range(20):
        steps, finish = _reply(engine, c, seed)
        value = json.loads(finish.text)  # always parses
        assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool), (seed, finish.text)
        assert type(value["n"]) is int and 0 <= value["n"] <= 9, (seed, finish.text)
        # it ends where the grammar ends (not by max_tokens), and says the structure closed
        assert finish.reason == FinishReason.STOP and finish.constraint_closed is True, (seed, finish)
        assert all(s.constraint is not None for s in steps)


def test_a_forced_pass_is_marked_and_the_reply_follows_the_grammar(engine) -> None:
    steps, finish = _reply(engine, Constraint("grammar", GBNF, "test.gbnf"), seed=3)
    assert finish.text in ("The answer is yes.", "The answer is no.")
    reports = [s.constraint for s in steps]
    assert all(r is not None for r in reports)
    forced = [s for s in steps if s.constraint.forced]
    assert forced, "the first words leave one token at a pass"
    for s in forced:
        assert s.constraint.allowed == 1 and s.sampled_prob == 1.0 and s.candidates_kept == 1
    free = [s for s in steps if not s.constraint.forced]
    assert all(s.constraint.allowed > 1 for s in free)
    # a forced pass forbade what the model wanted most (unless it wanted the forced token)
    for s in forced:
        r = s.constraint
        if s.raw_rank != 1:
            assert r.top_forbidden_id == s.raw_top[0].token_id
            assert r.top_forbidden_prob == pytest.approx(s.raw_top[0].prob, rel=1e-5)


def _ref_bits(matcher: LLMatcher, n_vocab: int) -> np.ndarray:
    mask = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
    return np.unpackbits(mask, count=n_vocab, bitorder="little").astype(bool)


def test_the_figures_equal_numpy_on_the_pass_logits(engine) -> None:
    """Pass by pass on the model's logits: the allowed count, the forbidden raw mass (1 minus
    the allowed tokens' raw mass, float64), the most likely forbidden token and its
    probability, `forced`, and the stage's own report, against an independent matcher."""
    c = Constraint("json_schema", json.dumps(SCHEMA), "test.json")
    stage = engine.open_constraint(c)
    from llguidance.llamacpp import lltokenizer_from_vocab

    tok = lltokenizer_from_vocab(llama_cpp.llama_model_get_vocab(engine.llm.model))
    ref = LLMatcher(tok, check(c, tok))
    engine.reset()
    prompt = engine.llm.tokenize(b"<|im_start|>user\nJSON please<|im_end|>\n<|im_start|>assistant\n", special=True)
    engine.evaluate(prompt)
    settings, rng, context = SamplingSettings().replace(seed=5, temperature=1.0), make_rng(5), list(prompt)
    seen_forced = False
    for _ in range(30):
        logits = engine.logits().copy()
        res = sample(logits, context, settings, rng, 10, constraint=stage)
        r = stage.report
        bits = _ref_bits(ref, engine.n_vocab)
        l64 = logits.astype(np.float64)
        w = np.exp(l64 - l64.max())
        assert r.allowed == int(bits.sum())
        assert abs(r.forbidden_mass - (1.0 - w[bits].sum() / w.sum())) <= 1e-9
        if r.allowed < engine.n_vocab:
            top = int(np.argmax(np.where(bits, -np.inf, l64)))
            assert r.top_forbidden_id == top and abs(r.top_forbidden_prob - w[top] / w.sum()) <= 1e-12
            assert r.top_forbidden_text == engine.piece_text(top)
        assert r.forced == (r.allowed == 1)
        seen_forced |= r.forced
        assert bits[res.token_id] and all(bits[i] for i in res.sampled_top_ids)
        report = next(s for s in res.stages if s.stage == "constraint")
        assert report.removed == engine.n_vocab - r.allowed
        assert [s.stage for s in res.stages][:3] == ["repeat_penalty", "dry", "constraint"]
        assert stage.consume(res.token_id) and ref.consume_token(res.token_id)
        context.append(res.token_id)
        if stage.stopped:
            break
        engine.forward(res.token_id)
    assert stage.stopped and ref.is_stopped() and seen_forced


def _llama_allowed(smpl: int, n_vocab: int) -> np.ndarray:
    """The tokens llama.cpp's sampler leaves a finite logit, every token given logit 0. The
    C array is filled and read through numpy's view of it (its fields id, logit, p), not
    49,152 Python objects a step each way."""
    data = (llama_cpp.llama_token_data * n_vocab)()
    np.ctypeslib.as_array(data)["id"] = np.arange(n_vocab)
    arr = llama_cpp.llama_token_data_array(data, n_vocab, -1, False)
    llama_cpp.llama_sampler_apply(smpl, ctypes.byref(arr))
    after = np.ctypeslib.as_array(arr.data, shape=(arr.size,))  # (where the sampler left them)
    out = np.zeros(n_vocab, dtype=bool)
    out[after["id"][after["logit"] != -np.inf]] = True
    return out


def test_llama_cpp_grammar_sampler_allows_the_same_tokens_at_every_step(engine) -> None:
    """The reference: llama.cpp's own grammar sampler on the same GBNF (never on the hot path)
    allows the same tokens as the stage at every step of a recorded reply, but one difference,
    llguidance's by design: where the grammar forces text (a literal), llguidance allows only
    the first token of that text's canonical tokenization (compute_ff_tokens), where llama.cpp
    allows any token that spells a prefix of it ("A", "An", "Ans" besides "Answer")."""
    grammar = 'root ::= "Answer: " ("yes" | "no") (", because " [a-z ]{1,12})? "."\n'
    c = Constraint("grammar", grammar, "ref.gbnf")
    vocab = llama_cpp.llama_model_get_vocab(engine.llm.model)
    eog = np.array([engine.is_eog(i) for i in range(engine.n_vocab)])
    same = forced_text = 0
    for seed in (12, 13):
        steps, finish = _reply(engine, c, seed=seed, max_tokens=40)
        assert finish.reason == FinishReason.STOP and finish.text.startswith("Answer: ")
        smpl = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        stage = engine.open_constraint(c)
        try:
            for s in steps:
                ours = stage.allowed_bits() & ~eog
                theirs = _llama_allowed(smpl, engine.n_vocab) & ~eog
                assert int(ours.sum()) == s.constraint.allowed  # (the recorded pass's count)
                assert not (ours & ~theirs).any(), (s.index, np.flatnonzero(ours & ~theirs)[:10])
                if np.array_equal(ours, theirs):
                    same += 1
                else:  # forced text: its canonical first token alone
                    ff = stage.matcher.compute_ff_tokens()
                    assert ff and np.flatnonzero(ours).tolist() == [ff[0]], (s.index, ff)
                    forced_text += 1
                llama_cpp.llama_sampler_accept(smpl, s.token_id)
                stage.consume(s.token_id)
        finally:
            llama_cpp.llama_sampler_free(smpl)
    assert same >= 15 and forced_text >= 2


def test_a_bad_grammar_is_one_line_with_the_position(tmp_path) -> None:
    bad = tmp_path / "bad.gbnf"
    bad.write_text('root ::= "yes" | answer\nanswer = "no"\n')
    with pytest.raises(ConstraintError) as info:
        check(read_constraint("grammar", bad))
    assert str(info.value) == f"grammar {bad}: line 2, column 8: Expected ::="
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "object",\n "properties": }')
    with pytest.raises(ConstraintError) as info:
        check(read_constraint("json_schema", schema))
    assert str(info.value).startswith(f"JSON schema {schema}: line 2, column 16: not valid JSON")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loopchat", "run", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_run_refuses_a_bad_grammar_file_in_one_line_before_any_reply(tmp_path) -> None:
    bad = tmp_path / "bad.gbnf"
    bad.write_text('root ::= "yes" | answer\n')
    proc = _run("--grammar", str(bad), "Hello")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"loopchat: grammar {bad}: line 1, column 18: rule 'answer' is used and not defined\n"


def test_run_says_a_reply_was_cut_before_its_structure_closed() -> None:
    proc = _run("--json", "--max-tokens", "2", "--seed", "1", "Describe Paris as JSON.")
    assert proc.returncode == 0, proc.stderr
    assert "finish: length" in proc.stderr
    assert "loopchat: note: the reply was cut before its structure closed (any JSON object)" in proc.stderr
    with pytest.raises(json.JSONDecodeError):
        json.loads(proc.stdout)


def test_the_constraint_row_survives_the_trace_the_history_and_the_pipe() -> None:
    import pickle
    from dataclasses import replace

    from tui_fixtures import REPLY_TRACE

    from loopchat.constraint import ConstraintReport
    from loopchat.event_json import event_from_json_dict, to_json_dict
    from loopchat.history.step_codec import decode_steps, encode_steps
    from loopchat.trace import read_trace

    steps = [t.event for t in read_trace(REPLY_TRACE)[1] if isinstance(t.event, Step)][:3]
    rows = [ConstraintReport(1, 0.75, 5, "x", 0.5, True), ConstraintReport(40, 0.0, -1, "", 0.0, False), None]
    shaped = [replace(s, constraint=r) for s, r in zip(steps, rows)]
    assert decode_steps(encode_steps(shaped)) == shaped
    assert [event_from_json_dict(json.loads(json.dumps(to_json_dict(s)))) for s in shaped] == shaped
    assert "constraint" not in to_json_dict(shaped[2])  # none: left out of the trace, as before
    assert pickle.loads(pickle.dumps(shaped[0])) == shaped[0]


def test_models_toml_gives_a_model_its_constraint(tmp_path) -> None:
    from loopchat.config import ConfigError, load_config

    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    toml = tmp_path / "models.toml"
    toml.write_text('[models.shaped]\nbuiltin = "smollm2-135m-instruct"\njson_schema = "s.json"\n')
    spec = load_config(toml).get("shaped")
    c = spec.constraint()
    assert c == Constraint("json_schema", json.dumps(SCHEMA), str(tmp_path / "s.json"))
    toml.write_text('[models.shaped]\nbuiltin = "smollm2-135m-instruct"\njson_schema = "s.json"\ngrammar = "g.gbnf"\n')
    with pytest.raises(ConfigError, match="has both grammar and json_schema"):
        load_config(toml)


def test_the_info_line_says_a_reply_was_cut_before_its_structure_closed() -> None:
    from dataclasses import replace

    from tui_fixtures import REPLY_TRACE

    from loopchat.chat.views.panel_constraint import constraint_part
    from loopchat.constraint import ConstraintReport
    from loopchat.trace import read_trace

    events = [t.event for t in read_trace(REPLY_TRACE)[1]]
    steps = [e for e in events if isinstance(e, Step)][:2]
    finish = next(e for e in events if isinstance(e, Finish))
    assert constraint_part(steps, finish) is None  # no constraint: nothing said
    rows = [ConstraintReport(1, 0.25, 3, "x", 0.2, True), ConstraintReport(9, 0.5, 4, "y", 0.1, False)]
    shaped = [replace(s, constraint=r) for s, r in zip(steps, rows)]
    closed = constraint_part(shaped, replace(finish, constraint_closed=True))
    assert closed == "constraint: 1 of 2 passes forced, forbidden mass 0.750 in all (0.375 a pass)"
    cut = constraint_part(shaped, replace(finish, reason=FinishReason.LENGTH, constraint_closed=False))
    assert cut == closed + " · cut before its structure closed"
    # a reply cut before its first pass: no mean a pass (nothing to divide)
    from loopchat.constraint import reply_summary

    assert reply_summary("constraint", []) == "constraint: 0 of 0 passes forced, forbidden mass 0.000 in all"


def test_a_token_picked_by_hand_that_the_grammar_forbids_is_refused_and_the_loop_waits(engine) -> None:
    """Step mode under a JSON constraint: a pick of a forbidden token is refused in one line (a
    Pending saying why, the loop still stopped); an allowed pick is taken, and the reply parses."""
    import queue
    import threading

    from loopchat.events import Pending
    from loopchat.step_control import HAND, StepControl

    control, events = StepControl(paused=True), queue.Queue()
    settings = SamplingSettings().replace(seed=4, max_tokens=40, temperature=0.7)
    run = engine.generate(ASK, settings, control=control, constraint=Constraint("json", "", ""))

    def feed() -> None:
        for e in run:
            events.put(e)
        events.put(None)

    threading.Thread(target=feed, daemon=True).start()

    def next_of(kind: type):
        while not isinstance(e := events.get(timeout=60), kind):
            assert e is not None, f"the run ended before a {kind.__name__}"
        return e

    first = next_of(Pending)
    assert first.refused is None
    hello, brace = engine.first_token("Hello"), engine.first_token("{")
    control.pick(hello)  # no JSON object starts with it
    refused = next_of(Pending)
    assert refused.index == first.index and refused.refused is not None
    assert (
        refused.refused
        == "the any JSON object constraint does not allow 'Hello' here: pick a token it allows, or draw (Enter)"
    )
    assert refused.raw_top == first.raw_top  # the same die, still waiting
    control.pick(brace)
    step = next_of(Step)
    assert step.chosen_by == HAND and step.token_id == brace and step.index == 0
    control.resume()
    finish = next_of(Finish)
    assert finish.reason in (FinishReason.STOP, FinishReason.LENGTH) and finish.error is None
    if finish.reason == FinishReason.STOP:
        assert isinstance(json.loads(finish.text), dict)


def test_a_branch_the_grammar_cannot_take_is_refused_before_any_event(engine) -> None:
    """A branch under a constraint: its prefix must follow the grammar, and the token picked to
    follow it must be one the grammar allows there; else one line, before the reply starts."""
    from loopchat.errors import EngineError

    json_any = Constraint("json", "", "")
    steps, finish = _reply(engine, json_any, seed=2)
    assert finish.error is None and len(steps) > 3
    prefix = (steps[0].token_id,)
    assert engine.piece(prefix[0]) == b"{"  # (seed 2's first token: a value's place, no array open)
    settings = SamplingSettings().replace(seed=2, max_tokens=24, temperature=1.0)
    close = engine.first_token("]")  # no array is open
    with pytest.raises(EngineError) as refused:
        next(iter(engine.generate(ASK, settings, constraint=json_any, reply_prefix=prefix, first_token=close)))
    assert (
        str(refused.value)
        == "the any JSON object constraint does not allow ']' here: pick a token it allows, or clear the constraint"
    )
    # an allowed token: the branch runs, and its reply follows the grammar from the prefix on
    allowed = steps[1].token_id
    events = list(engine.generate(ASK, settings, constraint=json_any, reply_prefix=prefix, first_token=allowed))
    end = next(e for e in events if isinstance(e, Finish))
    assert end.error is None and end.reason in (FinishReason.STOP, FinishReason.LENGTH)
    # a reply written without the constraint does not follow it: branching it under one is refused
    words = (engine.first_token("Sure"), engine.first_token(","))
    with pytest.raises(EngineError, match="^the reply so far does not follow the any JSON object constraint: clear"):
        next(iter(engine.generate(ASK, settings, constraint=json_any, reply_prefix=words, first_token=close)))
