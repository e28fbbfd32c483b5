"""The logit lens (issue 26, part 1): each layer's output through the model's own final norm
and head. On both test models, the last layer agrees with the model's raw softmax (the same
top-10 order, probabilities within 1e-5); a pass's lens is the same live and recomputed
later; a model the lens cannot read gives a one-line notice, never a row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loopchat.engine.engine import Engine
from loopchat.engine.lens import LensHead, lens_rows
from loopchat.events import Message, Start, Step
from loopchat.settings import SamplingSettings

DOC = (Message("document", "The capital of France is Paris, and the capital of Germany is"),)
SETTINGS = SamplingSettings(seed=2, max_tokens=3, temperature=0.8)


def _lens_run(engine: Engine) -> tuple[Start, list[Step]]:
    engine.reset()
    events = list(engine.generate(DOC, SETTINGS, lens=True))
    return next(e for e in events if isinstance(e, Start)), [e for e in events if isinstance(e, Step)]


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64) - z.max()
    p = np.exp(z)
    return p / p.sum()


@pytest.fixture(scope="module")
def smol_lens_run(engine: Engine) -> tuple[Start, list[Step]]:
    """The default model's lens run, drawn once for the module (a fresh context, seed 2: the
    same Start and steps every time) and read by the tests below that take it."""
    return _lens_run(engine)


def _agrees(engine: Engine, run: tuple[Start, list[Step]] | None = None) -> None:
    start, steps = run or _lens_run(engine)
    lens = engine.open_lens()
    assert not isinstance(lens, str), lens
    assert start.lens_note is None
    tokens, captured = list(start.prompt_token_ids), []
    for step in steps:  # each pass's hidden states, its tokens evaluated afresh in the lens's context
        captured.append(lens.context.capture(tokens)[0])
        tokens.append(step.token_id)
    # the head applied to every pass's last-layer output at once: Gemma's head (not kept in
    # memory) is dequantized once, not once a pass
    last_layer = lens.head.logits(np.stack([hidden[lens.head.n_layer - 1] for hidden in captured]))
    for step, hidden, z in zip(steps, captured, last_layer, strict=True):
        rows = step.lens
        assert rows is not None and [r.layer for r in rows] == list(range(lens.head.n_layer))
        last = rows[-1]
        assert last.top_id == step.raw_top[0].token_id and last.top_prob == pytest.approx(
            step.raw_top[0].prob, abs=1e-5
        )
        assert last.drawn_rank == step.raw_rank and last.drawn_prob == pytest.approx(step.raw_prob, abs=1e-5)
        # the whole top 10: the head applied to the last layer's output against the raw softmax
        p = _softmax(z)
        order = list(np.argsort(-p, kind="stable")[:10])
        assert order == [c.token_id for c in step.raw_top], [(int(i), p[i]) for i in order] + [
            (c.token_id, c.prob, p[c.token_id]) for c in step.raw_top
        ]
        assert [p[i] for i in order] == pytest.approx([c.prob for c in step.raw_top], abs=1e-5)
        # recomputed later (the lens's context evaluates the tokens afresh): the same rows
        again = lens_rows(lens.head, hidden, step.token_id, engine.piece_text)
        assert [r.top_id for r in again] == [r.top_id for r in rows]
        assert [r.drawn_prob for r in again] == pytest.approx([r.drawn_prob for r in rows], abs=1e-5)
        assert [r.entropy for r in again] == pytest.approx([r.entropy for r in rows], abs=1e-4)


@pytest.mark.model
def test_the_last_layer_agrees_with_the_raw_softmax_default_model(engine: Engine, smol_lens_run) -> None:
    _agrees(engine, smol_lens_run)


@pytest.mark.model
def test_the_last_layer_agrees_with_the_raw_softmax_gemma(gemma_engine: Engine) -> None:
    _agrees(gemma_engine)


@pytest.mark.model
def test_off_no_lens_is_opened_and_no_rows(model_path: Path, tmp_path: Path) -> None:
    with Engine(model_path, n_ctx=512, threads=1, log_path=tmp_path / "llama.log") as engine:
        steps = [e for e in engine.generate(DOC, SETTINGS) if isinstance(e, Step)]
        assert steps and all(s.lens is None for s in steps)
        assert engine._lens is None  # no lens context, so no graph callback anywhere


def _gguf(path: Path, arch: str, tensors: dict[str, np.ndarray]) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_another_architecture_gets_a_one_line_notice(tmp_path: Path) -> None:
    f32 = np.zeros((8, 32), dtype=np.float32)
    head = LensHead(_gguf(tmp_path / "m.gguf", "rwkv7", {"token_embd.weight": f32}))
    assert head.problem.startswith("no lens for this architecture (rwkv7): ") and "\n" not in head.problem
    missing = LensHead(_gguf(tmp_path / "n.gguf", "llama", {"token_embd.weight": f32}))
    assert missing.problem == "no lens for this model: its file has no output_norm.weight (llama)"


@pytest.mark.model
def test_the_lens_rows_round_trip_through_a_trace(engine: Engine, smol_lens_run) -> None:
    from loopchat.event_json import event_from_json_dict, to_json_dict

    _, steps = smol_lens_run
    assert event_from_json_dict(to_json_dict(steps[0])) == steps[0]
    assert "lens" not in to_json_dict([e for e in engine.generate(DOC, SETTINGS) if isinstance(e, Step)][0])


@pytest.mark.model
@pytest.mark.server
def test_run_lens_prints_a_row_per_layer_for_each_pass(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from loopchat.trace import read_trace

    trace = tmp_path / "t.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "loopchat", "run", "--lens", "--max-tokens", "2", "--seed", "1", "--trace", str(trace), "Hi"],
        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL, env=dict(os.environ),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    steps = [t.event for t in read_trace(trace)[1] if isinstance(t.event, Step)]
    lines = proc.stderr.splitlines()
    for step in steps:
        title = next(i for i, line in enumerate(lines) if line.startswith(f"lens of pass {step.index} "))
        rows = lines[title + 1 : title + 1 + len(step.lens)]
        for line, r in zip(rows, step.lens):
            assert line.startswith(f"  layer {r.layer:3d}  top {r.top_text!r}") and f"rank {r.drawn_rank:6d}" in line
        assert len(step.lens) == 30  # SmolLM2-135M's layers


def test_a_file_cut_short_is_a_one_line_error_not_a_traceback(tmp_path: Path) -> None:
    f32 = np.zeros((8, 32), dtype=np.float32)
    whole = _gguf(tmp_path / "m.gguf", "llama", {"token_embd.weight": f32}).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:40])
    with pytest.raises(ValueError, match="its GGUF header could not be read"):
        LensHead(cut)


@pytest.mark.model
def test_the_history_s_step_codec_keeps_the_lens_rows(smol_lens_run) -> None:
    from loopchat.history.step_codec import decode_steps, encode_steps

    _, steps = smol_lens_run
    assert decode_steps(encode_steps(steps)) == steps
