"""The generation loop, on the real default model."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from gc_check import cyclic_garbage

from loopchat.engine.cores import physical_cores
from loopchat.engine.engine import Engine
from loopchat.errors import ContextOverflowError
from loopchat.events import ContextTrimmed, Finish, FinishReason, Message, Prefill, Start, Step
from loopchat.settings import LiveSettings, SamplingSettings

pytestmark = pytest.mark.model

SYSTEM = Message("system", "You are a helpful assistant.")


def convo(*texts: str) -> list[Message]:
    msgs = [SYSTEM]
    for i, text in enumerate(texts):
        msgs.append(Message("user" if i % 2 == 0 else "assistant", text))
    return msgs


def run(engine: Engine, messages, settings, **kw) -> tuple[Start, Prefill, list[Step], Finish]:
    events = list(engine.generate(messages, settings, **kw))
    start = next(e for e in events if isinstance(e, Start))
    prefill = next(e for e in events if isinstance(e, Prefill))
    steps = [e for e in events if isinstance(e, Step)]
    finish = events[-1]
    assert isinstance(finish, Finish)
    return start, prefill, steps, finish


def test_event_order_and_counts(engine: Engine) -> None:
    events = list(engine.generate(convo("Say hello."), SamplingSettings(seed=3, max_tokens=12)))
    kinds = [e.kind for e in events]
    assert kinds[0] == "start" and kinds[1] == "prefill" and kinds[-1] == "finish"
    assert set(kinds[2:-1]) == {"step"}
    steps = [e for e in events if isinstance(e, Step)]
    finish = events[-1]
    assert [s.index for s in steps] == list(range(len(steps)))
    assert finish.steps == len(steps)
    assert finish.completion_tokens == sum(1 for s in steps if not s.is_stop)
    assert finish.text == "".join(s.text for s in steps)
    assert finish.reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert finish.ttft_ms > 0 and finish.total_ms >= finish.ttft_ms
    assert steps[0].forward_tokens == events[1].evaluated_tokens
    assert steps[0].elapsed_ms == pytest.approx(finish.ttft_ms, abs=0.5)
    assert [s.elapsed_ms for s in steps] == sorted(s.elapsed_ms for s in steps)
    assert steps[-1].elapsed_ms <= finish.total_ms
    assert all(s.forward_tokens == 1 for s in steps[1:])


def test_prompt_is_rendered_with_the_models_template(engine: Engine) -> None:
    start, _, _, _ = run(engine, convo("Hi"), SamplingSettings(max_tokens=1))
    assert start.prompt_text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    im_start = engine.llm.tokenize(b"<|im_start|>", add_bos=False, special=True)
    assert len(im_start) == 1  # a special token, not split into text
    assert start.prompt_token_ids[0] == im_start[0]
    assert list(start.prompt_token_ids) == engine.tokenize(start.prompt_text)


def test_same_seed_same_tokens(engine: Engine) -> None:
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1234, max_tokens=30)
    engine.reset()
    a = [s.token_id for s in run(engine, convo("Tell me a story."), settings)[2]]
    b = [s.token_id for s in run(engine, convo("Tell me a story."), settings)[2]]  # KV reused
    engine.reset()
    c = [s.token_id for s in run(engine, convo("Tell me a story."), settings)[2]]
    assert a == b == c
    d = [s.token_id for s in run(engine, convo("Tell me a story."), settings.replace(seed=99))[2]]
    assert d != a  # the seed does matter at temperature 1 over the whole vocabulary


def test_settings_change_applies_at_the_next_step(engine: Engine) -> None:
    live = LiveSettings(
        SamplingSettings(temperature=1.2, seed=5, max_tokens=20, top_k=40, min_p=0.0, top_p=1.0, repeat_penalty=1.0)
    )
    steps: list[Step] = []
    for event in engine.generate(convo("List some fruits."), live):
        if isinstance(event, Step):
            steps.append(event)
            if event.index == 4:
                live.update(temperature=0.0)
    assert len(steps) > 6
    assert all(s.settings.temperature == 1.2 for s in steps[:5])
    assert steps[5].settings.temperature == 0.0
    assert steps[5].settings_changed == ("temperature",)
    assert all(s.settings_changed == () for s in steps[6:])
    assert all(s.settings_changed == () for s in steps[1:5])
    # greedy from step 5 on: the distribution sampled from is the single top token
    for s in steps[5:]:
        assert len(s.sampled_top) == 1 and s.sampled_prob == 1.0 and s.raw_rank == 1


def _softmax64(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max()
    e = np.exp(z)
    return e / e.sum()


def test_reported_probabilities_match_an_independent_softmax(engine: Engine, model_path) -> None:
    settings = SamplingSettings(
        temperature=0.5, top_k=3, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=7, max_tokens=6
    )
    start, _, steps, _ = run(engine, convo("What is the capital of France?"), settings)
    # A separate llama.cpp context, driven directly through the C API's logits.
    # ... with the engine's flash attention: its logits differ from those without it
    on = engine.flash_attn == "on"
    ref = llama_cpp.Llama(str(model_path), n_ctx=512, n_threads=engine.threads, flash_attn=on, verbose=False)
    try:
        ref.eval(list(start.prompt_token_ids))
        for step in steps:
            ptr = llama_cpp.llama_get_logits_ith(ref.ctx, -1)
            logits = np.ctypeslib.as_array(ptr, shape=(ref.n_vocab(),)).copy()
            p = _softmax64(logits)
            order = np.argsort(-p, kind="stable")[: len(step.raw_top)]
            assert [c.token_id for c in step.raw_top] == order.tolist()
            assert [c.prob for c in step.raw_top] == pytest.approx(p[order].tolist(), abs=2e-4)
            assert step.raw_prob == pytest.approx(p[step.token_id], abs=2e-4)
            assert step.raw_rank == int(np.count_nonzero(p > p[step.token_id])) + 1
            ent = -float(np.sum(p[p > 0] * np.log2(p[p > 0])))
            assert step.raw_entropy == pytest.approx(ent, abs=1e-3)
            # sampled-from distribution: top-3 logits at temperature 0.5
            top3 = order[:3]
            q = _softmax64(logits[top3] / 0.5)
            assert [c.token_id for c in step.sampled_top] == top3.tolist()
            assert [c.prob for c in step.sampled_top] == pytest.approx(q.tolist(), abs=2e-4)
            assert step.token_id in top3.tolist()
            assert step.candidates_kept == 3
            if step.is_stop:
                break
            ref.eval([step.token_id])
    finally:
        ref.close()


def test_the_loop_leaves_no_garbage_for_the_cycle_collector(engine: Engine) -> None:
    """On the engine thread, a collection pauses the loop: a step must not leave
    reference cycles behind (reading the logits through llama_cpp's binding left two a
    step: the pointer object and its dict)."""
    settings = SamplingSettings(seed=1, max_tokens=48)  # (seed 3 ended at 48 tokens on the stock wheel, 20 now)
    run(engine, convo("Count to twenty."), settings)  # warm: caches, templates
    with cyclic_garbage() as found:
        _, _, steps, _ = run(engine, convo("Count to twenty."), settings)
    assert len(steps) >= 40
    assert sum(found.values()) < 10, found


def test_top_p_and_min_p_shape_the_sampled_distribution(engine: Engine) -> None:
    s = SamplingSettings(temperature=1.0, top_k=50, top_p=0.5, min_p=0.0, repeat_penalty=1.0, seed=1, max_tokens=8)
    steps = run(engine, convo("Write a poem."), s)[2]
    for step in steps:
        assert 1 <= step.candidates_kept <= 50
        if step.candidates_kept <= len(step.sampled_top):
            assert sum(c.prob for c in step.sampled_top) == pytest.approx(1.0, abs=1e-6)
        # top-p keeps the smallest prefix whose raw mass reaches 0.5: all but the last kept
        # token sum to less than 0.5 of the (top-k) mass, so in raw terms less than 0.5 too
        kept_raw = [c.prob for c in step.raw_top[: step.candidates_kept]]
        if step.candidates_kept <= len(step.raw_top):
            assert sum(kept_raw[:-1]) < 0.5 + 1e-6
        assert step.sampled_prob >= step.raw_prob - 1e-6  # filtering only concentrates mass
    s2 = s.replace(top_p=1.0, min_p=0.2)
    for step in run(engine, convo("Write a poem."), s2)[2]:
        top = step.sampled_top[0].prob
        assert all(c.prob >= 0.2 * top - 1e-9 for c in step.sampled_top)


def test_utf8_is_held_back_until_a_character_is_whole(engine: Engine) -> None:
    settings = SamplingSettings(temperature=0.0, max_tokens=40, repeat_penalty=1.0)
    msgs = [SYSTEM, Message("user", "Repeat exactly: 😀 日本語 ✓ naïve café")]
    steps = run(engine, msgs, settings)[2]
    text = "".join(s.text for s in steps)
    # no replacement character mid-reply (the last step may carry one: max_tokens may cut
    # the reply inside a character, see the next test)
    assert "\ufffd" not in "".join(s.text for s in steps[:-1])
    # at least one token ended inside a multi-byte character: its text was held back...
    split = [s for s in steps if not s.is_stop and s.text == "" and "\ufffd" in s.piece]
    assert split, [s.piece for s in steps]
    # ...and released whole by a later step
    assert any(ord(ch) > 0x7F for ch in text)


def test_second_turn_reuses_the_kv_cache(engine: Engine) -> None:
    settings = SamplingSettings(seed=2, max_tokens=16)
    engine.reset()
    first = run(engine, convo("Name a colour."), settings)
    assert first[1].reused_tokens == 0
    assert first[1].evaluated_tokens == first[1].prompt_tokens
    second = run(engine, convo("Name a colour.", first[3].text, "Another one?"), settings)
    pre = second[1]
    assert pre.reused_tokens >= first[1].prompt_tokens
    assert pre.evaluated_tokens == pre.prompt_tokens - pre.reused_tokens
    assert pre.evaluated_tokens < pre.prompt_tokens / 2


def test_cancel_during_decode_stops_within_one_step(engine: Engine) -> None:
    seen: list[Step] = []
    finish = None
    for event in engine.generate(convo("Count from 1 to 100."), SamplingSettings(max_tokens=200, seed=1)):
        if isinstance(event, Step):
            seen.append(event)
            if event.index == 3:
                engine.cancel()
        elif isinstance(event, Finish):
            finish = event
    assert finish is not None and finish.reason == FinishReason.CANCELLED
    assert len(seen) == 4
    # still usable
    after = run(engine, convo("Say hi."), SamplingSettings(max_tokens=4, seed=1))[3]
    assert after.reason in (FinishReason.LENGTH, FinishReason.STOP) and after.steps >= 1


def test_cancel_from_another_thread(engine: Engine) -> None:
    first_step = threading.Event()
    done = threading.Event()

    def canceller() -> None:
        first_step.wait(30)
        engine.cancel()
        done.set()

    t = threading.Thread(target=canceller)
    t.start()
    steps = 0
    finish = None
    for event in engine.generate(convo("Count from 1 to 500."), SamplingSettings(max_tokens=1000, seed=1)):
        if isinstance(event, Step):
            steps += 1
            first_step.set()
            done.wait(30)  # the cancel has been requested: the loop must stop at this step
        elif isinstance(event, Finish):
            finish = event
    t.join()
    assert finish is not None and finish.reason == FinishReason.CANCELLED
    assert steps == 1


def test_abort_callback_stops_a_forward_pass(engine: Engine) -> None:
    """llama.cpp's abort callback (read from C, no GIL) ends llama_decode mid-batch."""
    tokens = engine.tokenize("word " * 300)
    engine.reset()
    engine._abort.set()
    with pytest.raises(RuntimeError, match="returned 2"):
        engine._eval(tokens)
    engine._abort.clear()
    engine._decode_failure(RuntimeError("llama_decode returned 2"))
    engine.reset()


def test_cancel_during_prefill(engine: Engine) -> None:
    long_text = "The quick brown fox jumps over the lazy dog. " * 120  # ~1200 tokens, 3 batches
    engine.reset()
    events = []
    for event in engine.generate(convo(long_text), SamplingSettings(max_tokens=10)):
        events.append(event)
        if isinstance(event, Start):
            engine.cancel()  # requested before/while the prefill runs
    prefill = next(e for e in events if isinstance(e, Prefill))
    finish = events[-1]
    assert finish.reason == FinishReason.CANCELLED
    assert prefill.evaluated_tokens < prefill.prompt_tokens
    assert not any(isinstance(e, Step) for e in events)
    after = run(engine, convo("Say hi."), SamplingSettings(max_tokens=3, seed=1))
    assert after[3].reason in (FinishReason.LENGTH, FinishReason.STOP)
    assert after[1].reused_tokens <= prefill.evaluated_tokens


@pytest.fixture(scope="module")
def small_engine(model_path, tmp_path_factory) -> Engine:
    # one thread, as the session's engine (conftest.py: auto costs ~2.4x the CPU per token
    # under make test's three workers); auto is tested below on an engine of its own
    eng = Engine(model_path, n_ctx=256, n_batch=128, threads=1, log_path=tmp_path_factory.mktemp("l") / "llama.log")
    yield eng
    eng.close()


def test_a_message_larger_than_the_context_is_a_clear_error(small_engine: Engine) -> None:
    with pytest.raises(ContextOverflowError) as err:
        list(small_engine.generate(convo("hello " * 400), SamplingSettings(max_tokens=10)))
    msg = str(err.value)
    assert "\n" not in msg and "256" in msg and "n_ctx" in msg


def test_old_turns_are_dropped_when_the_conversation_outgrows_the_context(small_engine: Engine) -> None:
    turns = []
    for i in range(8):
        turns += [f"Question {i}: " + "tell me more " * 6, f"Answer {i}: " + "here is more " * 6]
    turns.append("Last question?")
    events = list(small_engine.generate(convo(*turns), SamplingSettings(max_tokens=16, seed=1)))
    trimmed = next(e for e in events if isinstance(e, ContextTrimmed))
    start = next(e for e in events if isinstance(e, Start))
    assert trimmed.dropped_messages > 0
    assert trimmed.prompt_tokens_after < trimmed.prompt_tokens_before
    assert trimmed.prompt_tokens_after + 16 <= 256
    assert start.messages[0] == SYSTEM
    assert start.messages[-1].content == "Last question?"
    assert start.messages[1].role == "user"
    assert isinstance(events[-1], Finish)


def test_generation_stops_when_the_context_is_full(small_engine: Engine) -> None:
    ask = "Count. " + " ".join(["Then say the numbers again, slowly and clearly, one per line."] * 14)  # 218 tokens
    events = list(small_engine.generate(convo(ask), SamplingSettings(max_tokens=10_000, seed=1), ignore_eos=True))
    finish = events[-1]
    assert finish.reason == FinishReason.CONTEXT
    assert finish.n_past == 255
    assert sum(isinstance(e, Step) for e in events) >= 10  # (38: "Count." alone drew 234, each ~1.5x a prompt token)


def _cores_in_proc_cpuinfo() -> int | None:
    """The machine's physical cores as /proc/cpuinfo lists them: distinct (physical id,
    core id) pairs (None where it does not say)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    cores = set()
    for block in text.split("\n\n"):
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if "processor" in fields:
            if "core id" not in fields:
                return None
            cores.add((fields.get("physical id", "0"), fields["core id"]))
    return len(cores) or None


def test_threads_default_to_auto_up_to_the_physical_cores(model_path: Path, tmp_path: Path) -> None:
    # what physical_cores claims, counted without psutil: the machine's physical cores
    # (hyper-threads of one core count once), but no more than the CPUs we may run on
    machine = _cores_in_proc_cpuinfo()
    if machine is None:
        pytest.skip("/proc/cpuinfo does not list core ids here")
    usable = len(os.sched_getaffinity(0))
    assert physical_cores() == min(machine, usable) >= 1
    # the default is auto, choosing between 1 and that many (test_auto_threads.py); an engine
    # of its own: the session's is pinned to one thread (conftest.py)
    with Engine(model_path, n_ctx=256, log_path=tmp_path / "llama.log") as engine:
        assert engine.threads_auto and engine._tuner is not None and engine._tuner.max == physical_cores()
        assert 1 <= engine.threads <= physical_cores()


def test_entropy_is_in_bits(engine: Engine) -> None:
    steps = run(
        engine,
        convo("Hi"),
        SamplingSettings(max_tokens=3, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0),
    )[2]
    for s in steps:
        assert 0.0 <= s.raw_entropy <= math.log2(engine.n_vocab)
        assert s.sampled_entropy == pytest.approx(s.raw_entropy, abs=1e-3)  # nothing filtered, T=1


def test_token_pieces_are_exact_bytes(engine: Engine) -> None:
    # llama-cpp-python's own token_to_piece pads with NULs; ours must not
    for token_id in (0, 1, 2, 28, 100, 1000, 30000, engine.n_vocab - 1):
        piece = engine.piece(token_id)
        assert b"\x00" not in piece
    assert engine.piece(engine.tokenize("<|im_end|>")[0]) == b"<|im_end|>"
    assert engine.piece(engine.tokenize(" hello")[0]) == b" hello"


def test_a_context_size_llama_cpp_pads_is_used_as_asked(model_path, tmp_path) -> None:
    # llama.cpp pads n_ctx = 300 to 512 (and 100 to 256); llama-cpp-python's token buffer keeps
    # 300 slots. Was: engine.n_ctx 512, and an IndexError at token 300 of a long reply. 100 is
    # padded as 300 is, and fills in a third of the tokens.
    with Engine(model_path, n_ctx=100, threads=1, log_path=tmp_path / "llama.log") as eng:  # (1: small_engine)
        assert eng.llm.n_ctx() > 100  # the padding this test is about (if it goes, so can the cap)
        assert eng.n_ctx == 100 == len(eng.llm.input_ids)
        events = list(
            eng.generate(convo("Tell me a story."), SamplingSettings(max_tokens=1000, seed=1), ignore_eos=True)
        )
        start, finish = events[0], events[-1]
        assert isinstance(start, Start) and isinstance(finish, Finish)
        assert start.n_ctx == finish.n_ctx == 100
        assert finish.reason == FinishReason.CONTEXT and finish.error is None
        assert finish.n_past == 99 and finish.prompt_tokens + finish.completion_tokens == 100
        assert max(e.n_past for e in events if isinstance(e, Step)) == 100


def test_an_invalid_chat_template_is_a_load_error_naming_it(model_path, tmp_path) -> None:
    from loopchat.errors import ModelLoadError

    with pytest.raises(ModelLoadError) as err:
        Engine(model_path, name="x", chat_template="{% if %}", log_path=tmp_path / "llama.log", warmup=False)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("model 'x': chat_template is not a valid Jinja template (line 1: ")
    assert "models.toml" in msg


def test_the_llama_log_is_rotated_when_it_grows_past_a_megabyte(model_path, tmp_path) -> None:
    from loopchat.engine.llama_log import ROTATE_BYTES

    log = tmp_path / "llama.log"
    log.write_text("old line\n" * (ROTATE_BYTES // 9 + 1000))
    old_size = log.stat().st_size
    (tmp_path / "llama.log.1").write_text("the oldest log\n")
    with Engine(model_path, n_ctx=256, log_path=log, warmup=False):
        pass
    assert (tmp_path / "llama.log.1").stat().st_size == old_size  # one old file kept, the oldest gone
    text = log.read_text()
    assert "old line" not in text and "llama_model_loader" in text  # a fresh log of this load
    size = log.stat().st_size
    assert size < ROTATE_BYTES
    with Engine(model_path, n_ctx=256, log_path=log, warmup=False):
        pass
    assert log.stat().st_size > size  # under the limit: appended to, not rotated
    assert (tmp_path / "llama.log.1").stat().st_size == old_size


def test_the_steps_texts_add_up_to_the_reply_when_it_ends_inside_a_character(engine: Engine) -> None:
    settings = SamplingSettings(temperature=0.0, max_tokens=40, repeat_penalty=1.0)
    msgs = [SYSTEM, Message("user", "Repeat exactly: 😀 日本語 ✓ naïve café")]
    steps = run(engine, msgs, settings)[2]
    # the first token that ends inside a multi-byte character: stop the reply right there
    split = next(s for s in steps if not s.is_stop and s.text == "" and "\ufffd" in s.piece)
    cut = settings.replace(max_tokens=split.index + 1)
    _, _, cut_steps, finish = run(engine, msgs, cut)
    assert finish.reason == FinishReason.LENGTH and len(cut_steps) == split.index + 1
    assert cut_steps[-1].text.endswith("\ufffd")  # the unfinished character, on the last step
    assert "".join(s.text for s in cut_steps) == finish.text


def test_a_document_has_no_template_and_the_default_model_no_note(engine: Engine) -> None:
    from loopchat.errors import EngineError
    from loopchat.events import DOCUMENT

    assert engine.template_source == "gguf" and engine.template_note == "" and engine.opening_mode == "chat"
    text = "Once upon a time"
    start = next(iter(engine.generate([Message(DOCUMENT, text)], SamplingSettings(seed=1, max_tokens=2))))
    assert start.prompt_text == text and list(start.prompt_token_ids) == engine.tokenize(text)
    with pytest.raises(EngineError, match="document is empty"):
        next(iter(engine.generate([Message(DOCUMENT, "")], SamplingSettings())))
    with pytest.raises(ContextOverflowError, match="document is too long"):
        next(iter(engine.generate([Message(DOCUMENT, "word " * 3000)], SamplingSettings())))
