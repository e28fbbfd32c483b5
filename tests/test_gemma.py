"""The second model, Gemma 3 270M base (issue 11): nothing like the default one.

262,144 tokens of vocabulary (5x), another architecture and quantization, BOS added,
no chat template in the file. The engine loads it once per session (~250 MB; conftest.py).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from loopchat.engine import sampler
from loopchat.engine.chat_prompt import CHATML_TEMPLATE
from loopchat.engine.engine import Engine
from loopchat.events import Finish, Message, Start, Step
from loopchat.settings import SamplingSettings

pytestmark = [pytest.mark.model, pytest.mark.server]

PROMPT = [Message("user", "The lighthouse keeper looked at the sea and")]


@pytest.fixture(scope="module")
def gemma(gemma_engine: Engine) -> Engine:
    return gemma_engine  # the session's (conftest.py): loaded once for every module that reads Gemma


@pytest.fixture(scope="module")
def gemma_logits(gemma: Engine) -> list[np.ndarray]:
    """Real logit rows: after the prompt, then after each of three greedy tokens."""
    gemma.reset()
    gemma._eval(gemma.fit_prompt(PROMPT, 8).tokens)
    rows = []
    for _ in range(4):
        row = gemma._logits().copy()
        rows.append(row)
        gemma._decode_one(int(np.argmax(row)))
        gemma._sync()
    gemma.reset()
    return rows


def test_loads_with_its_own_vocabulary_bos_and_the_fallback_template(gemma: Engine) -> None:
    assert gemma.n_vocab == 262_144
    assert gemma.add_bos is True
    assert "tokenizer.chat_template" not in gemma.llm.metadata
    assert gemma.chat_template == CHATML_TEMPLATE  # the engine's fallback
    tokens = gemma.tokenize("Hello")
    assert tokens[0] == gemma.llm.token_bos() and len(tokens) >= 2


def _filled(step: Step) -> dict[str, bool]:
    """Which fields of a Step carry something (a non-empty list, a positive number...)."""
    out = {}
    for f in fields(step):
        v = getattr(step, f.name)
        out[f.name] = bool(v) if isinstance(v, (tuple, str, int, float)) and not isinstance(v, bool) else v is not None
    return out


def test_a_reply_fills_every_step_as_on_the_default_model(gemma: Engine, engine: Engine) -> None:
    settings = SamplingSettings(seed=7, max_tokens=16)
    events = list(gemma.generate(PROMPT, settings, report_k=10, ignore_eos=True))
    start = events[0]
    assert isinstance(start, Start) and start.n_vocab == 262_144
    assert start.prompt_token_ids[0] == gemma.llm.token_bos()
    steps = [e for e in events if isinstance(e, Step)]
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.steps == len(steps) == 16
    assert finish.text == "".join(s.text for s in steps)
    for s in steps:
        assert len(s.raw_top) == 10 and 1 <= len(s.sampled_top) <= 10
        raw = [c.prob for c in s.raw_top]
        sampled = [c.prob for c in s.sampled_top]
        assert raw == sorted(raw, reverse=True) and sampled == sorted(sampled, reverse=True)
        assert 0 < sum(raw) <= 1 + 1e-6 and 0 < sum(sampled) <= 1 + 1e-6
        assert all(0 <= c.token_id < 262_144 for c in s.raw_top + s.sampled_top)
        assert 0 < s.raw_prob <= 1 and 0 < s.sampled_prob <= 1
        assert s.raw_rank >= 1 and 1 <= s.sampled_rank <= s.candidates_kept
        assert s.raw_entropy > 0 and s.forward_ms > 0 and s.sample_ms > 0
    assert [s.n_past for s in steps] == list(range(steps[0].n_past, steps[0].n_past + 16))
    # the same fields are filled as on the default model
    default_step = next(
        e
        for e in engine.generate(PROMPT, settings.replace(max_tokens=2), ignore_eos=True)
        if isinstance(e, Step) and e.index == 1
    )
    want = _filled(default_step)
    for s in steps[1:]:
        got = _filled(s)
        for name in (
            "raw_top",
            "sampled_top",
            "raw_prob",
            "sampled_prob",
            "raw_rank",
            "sampled_rank",
            "raw_entropy",
            "candidates_kept",
            "forward_ms",
            "forward_tokens",
            "sample_ms",
            "n_past",
            "elapsed_ms",
        ):
            assert got[name] == want[name], name


def reference(logits: np.ndarray, s: SamplingSettings) -> tuple[np.ndarray, np.ndarray]:
    """The documented chain over the whole vocabulary with a plain full sort (no repeat
    penalty): the kept token ids, most likely first, and their probabilities."""
    work = logits.astype(np.float64)
    order = np.argsort(-work, kind="stable")
    if s.top_k > 0:
        order = order[: s.top_k]
    if s.top_p < 1.0:
        p = np.exp(work[order] - work[order[0]])
        cum = np.cumsum(p / p.sum())
        order = order[: int(np.searchsorted(cum, s.top_p, side="left")) + 1]
    if s.min_p > 0:
        order = order[work[order] >= work[order[0]] + math.log(s.min_p)]
    q = np.exp((work[order] - work[order[0]]) / s.temperature)
    return order, q / q.sum()


@pytest.mark.parametrize(
    "settings",
    [
        SamplingSettings(top_k=0, top_p=1.0, min_p=0.0, temperature=2.0, repeat_penalty=1.0),
        SamplingSettings(top_k=0, top_p=0.9, min_p=0.0, temperature=1.0, repeat_penalty=1.0),
        SamplingSettings(top_k=0, top_p=0.95, min_p=0.05, temperature=0.7, repeat_penalty=1.0),
        SamplingSettings(top_k=40, top_p=0.95, min_p=0.05, temperature=0.7, repeat_penalty=1.0),
    ],
    ids=["all-off-t2", "top-p-0.9", "top-p-min-p", "defaults"],
)
def test_the_sampled_distribution_is_exact_on_real_logits(
    gemma_logits: list[np.ndarray], settings: SamplingSettings
) -> None:
    for logits in gemma_logits:
        ids, probs = reference(logits, settings)
        res = sampler.sample(logits, [], settings, sampler.make_rng(0), report_k=40)
        assert res.kept == ids.shape[0]
        n = min(40, ids.shape[0])
        assert res.sampled_top_probs.tolist() == pytest.approx(probs[:n].tolist(), abs=1e-9)
        # the same ids in the same order, except where equal probabilities may swap
        for i in np.flatnonzero(res.sampled_top_ids != ids[:n]):
            assert np.count_nonzero(probs == probs[i]) > 1, (i, res.sampled_top_ids[i], ids[i])
        pos = {int(t): i for i, t in enumerate(ids)}
        assert res.token_id in pos
        assert res.sampled_prob == pytest.approx(probs[pos[res.token_id]], abs=1e-9)
        nz = probs[probs > 0]
        assert res.sampled_entropy == pytest.approx(float(-(nz * np.log2(nz)).sum()), abs=1e-6)
        raw = np.exp(logits.astype(np.float64) - logits.max())
        raw /= raw.sum()
        top_raw = np.sort(raw)[::-1][:40]
        assert res.raw_top_probs.tolist() == pytest.approx(top_raw.tolist(), rel=1e-5)
        assert res.raw_prob == pytest.approx(raw[res.token_id], rel=1e-5)


def _run_gemma(gemma_path: Path, *args: str) -> subprocess.CompletedProcess:
    base = [sys.executable, "-m", "loopchat", "run", "--model", str(gemma_path), "--max-tokens", "4", "--seed", "1"]
    return subprocess.run([*base, *args], capture_output=True, text=True, timeout=300, env=dict(os.environ))


@pytest.fixture(scope="module")
def gemma_chat_run(gemma_path: Path) -> subprocess.CompletedProcess:
    """`loopchat run --model PATH.gguf` on a chat message: one process for the two tests that
    read it (the path taken; the note on the missing template)."""
    return _run_gemma(gemma_path, "The lighthouse keeper")


def test_loopchat_run_takes_the_gguf_path(gemma_chat_run: subprocess.CompletedProcess) -> None:
    proc = gemma_chat_run
    assert proc.returncode == 0, proc.stderr
    assert "finish: " in proc.stderr and "Traceback" not in proc.stderr


async def test_the_chat_shows_the_same_panel_on_gemma(gemma_path: Path, tmp_path: Path) -> None:
    """`loopchat --model PATH.gguf` on a model of another architecture and a 5x larger
    vocabulary: the same loop panel, filled from its own logits; auto threads."""
    from tui_fixtures import panel_text, wait_for, wait_run

    from loopchat.backends.live import LiveBackend
    from loopchat.chat.prefs import Prefs
    from loopchat.settings import SamplingSettings
    from loopchat.tui.launch import create_app

    backend = LiveBackend(None, str(gemma_path))
    backend.start()
    try:
        app = create_app(
            backend=backend,
            prefs=Prefs(markdown=False),
            prefs_path=tmp_path / "prefs.json",
            settings=SamplingSettings(seed=3, max_tokens=12, temperature=0.8),
        )
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, app.model_ready.is_set, 60, "Gemma to load")
            await pilot.press(*"The capital of France is", "enter")
            await wait_run(pilot, 120)
            rec = app.conversation.replies[0]
            assert rec.finish is not None and rec.start is not None
            assert rec.start.n_vocab == 262_144 and rec.start.threads_auto
            text = panel_text(app)
            assert f"Forward pass {rec.finish.steps}" in text
            assert "raw softmax" in text and "after sampling" in text
            # the threads row says auto; its reason wherever the tuner gave one in these 12 passes
            # (its first measurement can take longer than 12 passes on a loaded machine)
            assert re.search(r"threads +\d+ auto", text) and "tok/s" in text
            assert "auto ·" in text or not any(s.threads_reason for s in rec.steps)
            assert "drew " in text and f"/ {rec.start.n_ctx:,} tokens" in text
            # no chat template in its file: the chat opens it in completion mode (not ChatML
            # it has never seen), says so, and where to set a template
            notes = [str(n.message) for n in app.notices]
            assert (
                "completion mode: this model has no chat template; set chat_template in models.toml for chat" in notes
            )
            assert rec.start.prompt_text == "The capital of France is" and app.session.completion
    finally:
        backend.close()


def test_a_document_is_continued_as_it_is(gemma: Engine) -> None:
    """Completion mode: a DOCUMENT message is tokenized as it is (BOS added, as the model
    asks), no template markers; a chat on a model without a template carries a note."""
    from loopchat.events import DOCUMENT

    text = "The capital of France is"
    events = list(gemma.generate([Message(DOCUMENT, text)], SamplingSettings(seed=1, max_tokens=6)))
    start = events[0]
    assert isinstance(start, Start)
    assert start.prompt_text == text and start.messages == (Message(DOCUMENT, text),)
    assert list(start.prompt_token_ids) == gemma.tokenize(text)
    assert start.prompt_token_ids[0] == gemma.llm.token_bos() and "<|im_start|>" not in start.prompt_text
    assert gemma.template_source == "fallback" and "set chat_template" in gemma.template_note
    assert gemma.opening_mode == "completion"  # the chat opens it on a document, not ChatML


def test_run_raw_and_the_template_note(gemma_path: Path, gemma_chat_run: subprocess.CompletedProcess) -> None:
    raw = _run_gemma(gemma_path, "--raw", "The capital of France is")
    assert raw.returncode == 0, raw.stderr
    assert raw.stdout.strip() and "note:" not in raw.stderr and "finish: " in raw.stderr
    chat = gemma_chat_run  # the same run without --raw: a chat message, and Gemma has no template
    assert chat.returncode == 0, chat.stderr
    note = [line for line in chat.stderr.splitlines() if line.startswith("loopchat: note: ")]
    assert len(note) == 1 and "no chat template" in note[0] and "--raw" in note[0]
    both = _run_gemma(gemma_path, "--raw", "--system", "be brief", "hi")
    assert both.returncode == 2 and both.stderr.count("\n") == 1 and "--raw" in both.stderr
