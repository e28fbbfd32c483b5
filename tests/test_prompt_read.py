"""The prompt's surprisals as `loopchat run --prompt-logprobs` prints them (a real
subprocess on the real default model), and the figures behind them (prompt_read.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loopchat.events import Message, Prefill, Start, Step
from loopchat.prompt_read import SYSTEM, TEMPLATE, USER, summary, surprisals, token_kinds
from loopchat.settings import SamplingSettings
from loopchat.trace import read_trace


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loopchat", "run", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.model
@pytest.mark.server
def test_run_prints_each_prompt_token_s_surprisal_from_the_trace_s_logprobs(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    proc = _run("What is the capital of Germany?", "--prompt-logprobs", "--max-tokens", "3", "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr
    events = [t.event for t in read_trace(trace)[1]]
    start = next(e for e in events if isinstance(e, Start))
    prefill = next(e for e in events if isinstance(e, Prefill))
    lines = proc.stderr.splitlines()
    n = len(start.prompt_token_ids)
    assert len(prefill.prompt_logprobs) == n
    rows = lines[:n]
    for i, row in enumerate(rows):
        assert row.split()[0] == str(i) and row.split()[1] == str(start.prompt_token_ids[i])
        if i:
            assert f"{-prefill.prompt_logprobs[i] / math.log(2):.2f} bits" in row
            assert f"top {prefill.prompt_top[i][0].text!r}" in row
    bits = [-lp / math.log(2) for lp in prefill.prompt_logprobs[1:]]
    ppl = 2 ** (sum(bits) / len(bits))
    assert lines[n].startswith(f"prompt: {n} tokens, perplexity {ppl:.2f} over {n - 1}; most surprising")
    assert "Germany" in "".join(r for r in rows if " user " in r)


@pytest.mark.model
@pytest.mark.server
def test_score_only_reads_the_prompt_and_writes_nothing(tmp_path: Path) -> None:
    """--score-only: the prompt's surprisals as --prompt-logprobs prints them, then no reply (no
    Step in the trace, an empty stdout line) and a summary without a first token's time or rate."""
    trace = tmp_path / "t.jsonl"
    proc = _run("The capital of France is London", "--raw", "--score-only", "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr
    events = [t.event for t in read_trace(trace)[1]]
    assert not any(isinstance(e, Step) for e in events)
    prefill = next(e for e in events if isinstance(e, Prefill))
    lines = proc.stderr.splitlines()
    assert "' London'" in lines[5] and f"{-prefill.prompt_logprobs[5] / math.log(2):.2f} bits" in lines[5]
    assert lines[6].startswith("prompt: 6 tokens, perplexity")
    assert lines[-1].startswith("prompt 6 tok · prefill") and " · 0 tok · " in lines[-1]
    assert "TTFT" not in lines[-1] and lines[-1].endswith("finish: length")
    assert proc.stdout.strip() == ""
    refused = _run("Hi", "--score-only", "-n", "2")
    assert refused.returncode == 2 and "--score-only writes no reply" in refused.stderr


@pytest.mark.model
@pytest.mark.server
def test_without_the_flag_nothing_is_printed_or_computed(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    proc = _run("Hi.", "--max-tokens", "2", "--trace", str(trace))
    assert proc.returncode == 0 and len(proc.stderr.splitlines()) == 1, proc.stderr
    prefill = next(t.event for t in read_trace(trace)[1] if isinstance(t.event, Prefill))
    assert prefill.prompt_logprobs is None


def test_the_figures() -> None:
    bits = surprisals(Prefill(3, 0, 3, 1, 1.0, (None, -math.log(2), -3 * math.log(2))))
    assert bits == pytest.approx((None, 1.0, 3.0)) if bits else False
    s = summary(bits)
    assert s is not None and s.scored == 2 and s.perplexity == pytest.approx(4.0) and s.worst == 2
    assert surprisals(Prefill(3, 0, 3, 1, 1.0)) is None


def test_tokens_are_told_apart_system_user_template() -> None:
    texts = ("<|im_start|>", "system", "\n", "Be", " brief", "<|im_end|>", "\n", "<|im_start|>", "user", "\n")
    texts += ("Hi", " there", "<|im_end|>", "\n")
    start = Start(
        "m", None, None, None, None, None,
        (Message("system", "Be brief"), Message("user", "Hi there")),
        "".join(texts), tuple(range(len(texts))), SamplingSettings(), 10,
        prompt_token_texts=texts, prompt_special=(0, 5, 7, 12),
    )  # fmt: skip
    kinds = token_kinds(start)
    assert kinds[3:5] == (SYSTEM, SYSTEM) and kinds[10:12] == (USER, USER)
    assert {kinds[i] for i in (0, 1, 2, 5, 6, 7, 8, 9, 12, 13)} == {TEMPLATE}


def test_a_branch_s_prefix_scored_too_leaves_the_prompt_s_colours() -> None:
    from loopchat.chat.views.document_surprisal import scored_prompt

    texts = ("Hi", " there", " you")
    start = Start(
        "m", None, None, None, None, None, (Message("document", "Hi there you"),), "Hi there you",
        (1, 2, 3), SamplingSettings(), 10, reply_prefix=(4,), prompt_token_texts=texts,
    )  # fmt: skip
    lp = (None, -math.log(2), -2 * math.log(2), -5.0)  # the prefix's token scored last
    scored = scored_prompt(start, Prefill(4, 0, 4, 1, 1.0, lp, ((),) * 4))
    assert scored is not None and [b for b, _, _ in scored] == pytest.approx([None, 1.0, 2.0]) if scored else False
    assert scored_prompt(start, Prefill(4, 0, 2, 1, 1.0, lp[:2], ((),) * 2)) is None  # cancelled mid-prefill


@pytest.mark.server
@pytest.mark.parametrize("flag", ["--prompt-logprobs", "--lens"])
def test_with_a_server_the_flags_are_one_line_and_exit_2(flag: str) -> None:
    proc = _run("Hi", flag, "--url", "http://127.0.0.1:9")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"loopchat: {flag} needs a model run here, not one on a server " + (
        "(a server's prompt logprobs: its completions with echo and logprobs)"
    )
