"""Speculative decoding from the outside (issue 25, item 1): `loopchat run --draft` and its
lines, its one-line errors, and `loopchat serve` taking `draft` per request (OpenAI's SDK,
`extra_body`), its steps' pass fields in the `loopchat` extension and read back by `--url`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from openai import OpenAI
from serve_process import KEY, Serve

from loopchat.events import Finish, Step
from loopchat.pass_lines import draft_summary, pass_figures, pass_line
from loopchat.trace import read_trace
from loopchat.wire import extension_events

pytestmark = [pytest.mark.model, pytest.mark.server]

PY = sys.executable
TEXT = (
    "Speculative decoding lets a model check several guessed tokens in one forward pass. "
    "Each guess is kept only when the model would have drawn it anyway, so the text does not change."
)
PROMPT = "Repeat the following text exactly: " + TEXT
COPY = ["--temperature", "0", "--repeat-penalty", "1", "--dry-multiplier", "0", "--threads", "1"]


def loopchat(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "loopchat", *args], capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL
    )


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loopchat: "), proc.stderr
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def test_run_draft_lookup_prints_its_passes_and_the_draft_s_summary(tmp_path: Path) -> None:
    traces = tmp_path / "plain.jsonl", tmp_path / "draft.jsonl"
    plain = loopchat("run", PROMPT, *COPY, "--max-tokens", "60", "--trace", str(traces[0]))
    proc = loopchat(
        "run", PROMPT, *COPY, "--max-tokens", "60", "--draft", "lookup", "--show-passes", "--trace", str(traces[1])
    )
    assert proc.returncode == 0 and plain.returncode == 0, proc.stderr + plain.stderr
    plain_steps, steps = ([t.event for t in read_trace(p)[1] if isinstance(t.event, Step)] for p in traces)
    reports = {s.pass_report.number: s.pass_report for s in steps if s.pass_report}
    assert reports, proc.stderr
    lines = proc.stderr.splitlines()
    assert [line for line in lines if line.startswith("loopchat: pass ")] == [
        f"loopchat: {pass_line(r)}" for r in reports.values()
    ]
    assert f"loopchat: draft {draft_summary(pass_figures(steps))}" in lines
    assert "loopchat: draft" not in plain.stderr  # no draft: no line
    assert [s.token_id for s in steps] == [s.token_id for s in plain_steps]  # batch-invariant logits
    assert proc.stdout == plain.stdout


def test_run_s_draft_options_fail_in_one_line(tmp_path: Path, gemma_path: Path) -> None:
    one_line_error(loopchat("run", "hi", "--draft", "maybe"), "--draft", "lookup", "model")
    one_line_error(loopchat("--draft", "lookup"), "the chat takes no --draft", "F2", "loopchat run --draft")
    one_line_error(loopchat("run", "hi", "--draft-max", "0"), "draft_max must be between 1 and 64")
    one_line_error(loopchat("run", "hi", "--draft", "model", "--threads", "1"), "--draft-model PATH")
    missing = tmp_path / "nothing.gguf"
    one_line_error(loopchat("run", "hi", "--draft-model", str(missing), "--threads", "1"), str(missing), "not a file")
    line = one_line_error(loopchat("run", "hi", "--draft-model", str(gemma_path), "--threads", "1"), "vocabulary")
    assert "262,144 tokens" in line and "49,152" in line


@pytest.fixture(scope="module")
def server(queue_one_server: Serve) -> Serve:
    return queue_one_server  # the session's (conftest.py)


def test_serve_takes_a_draft_per_request_and_sends_the_pass_fields(server: Serve, tmp_path: Path) -> None:
    client: OpenAI = server.client(KEY)
    kw = {"model": "any", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 50, "temperature": 0}
    body = {"repeat_penalty": 1.0, "dry_multiplier": 0.0, "cache_prompt": False}
    plain = client.chat.completions.create(**kw, extra_body=body)
    spec = client.chat.completions.create(**kw, extra_body={**body, "draft": "lookup", "draft_max": 6})
    steps = [e for e in extension_events(spec.to_dict()) if isinstance(e, Step)]
    reports = [s.pass_report for s in steps if s.pass_report is not None]
    assert reports and all(r.source == "lookup" and r.drafted <= 6 for r in reports)
    assert all(s.pass_report is None for s in extension_events(plain.to_dict()) if isinstance(s, Step))
    finish = next(e for e in extension_events(spec.to_dict()) if isinstance(e, Finish))
    assert finish.text == spec.choices[0].message.content
    # streamed, the same steps, chunk by chunk; `run --url` reads them back into its trace
    chunks = client.chat.completions.create(**kw, stream=True, extra_body={**body, "draft": "lookup", "draft_max": 6})
    streamed = [e for c in chunks for e in extension_events(c.to_dict()) if isinstance(e, Step)]
    # (how many to draft is paced by measured pass costs, so two requests may batch differently:
    # each streamed pass's steps must be the pass's own, consecutive, as many as it says it gave)
    numbers = [s.pass_report.number for s in streamed if s.pass_report is not None]
    assert numbers and numbers == sorted(numbers)
    for number in set(numbers[:-1]) - {numbers[-1]}:
        group = [s for s in streamed if s.pass_report is not None and s.pass_report.number == number]
        assert len(group) == group[0].pass_report.tokens and all(g.pass_report == group[0].pass_report for g in group)
    trace = tmp_path / "t.jsonl"
    proc = loopchat("run", "--url", server.url, "--api-key", KEY, PROMPT, *COPY[:6], "--max-tokens", "50")
    assert proc.returncode == 0, proc.stderr
    proc = loopchat(
        "run",
        "--url",
        server.url,
        "--api-key",
        KEY,
        PROMPT,
        *COPY[:6],
        "--max-tokens",
        "50",
        "--draft",
        "lookup",
        "--trace",
        str(trace),
    )
    assert proc.returncode == 0, proc.stderr
    traced = [t.event for t in read_trace(trace)[1] if isinstance(t.event, Step)]
    assert any(s.pass_report is not None for s in traced) and "loopchat: draft " in proc.stderr
    bad = client.with_options(max_retries=0)
    with pytest.raises(Exception) as err:
        bad.chat.completions.create(**kw, extra_body={"draft": "sometimes"})
    assert "draft must be one of off, lookup, model" in str(err.value)


def test_run_prediction_drafts_the_predicted_text_and_the_reply_is_the_same(tmp_path: Path) -> None:
    """--prediction FILE (OpenAI's Predicted Outputs): the text of a first run predicted, the same
    text in fewer passes, every draft the prediction gave kept; its passes name the source."""
    story = "Write a short story about a lighthouse keeper."
    first = loopchat("run", story, *COPY, "--max-tokens", "80")
    assert first.returncode == 0, first.stderr
    predicted = tmp_path / "predicted.txt"
    predicted.write_text(first.stdout.rstrip("\n"), encoding="utf-8")
    trace = tmp_path / "p.jsonl"
    again = loopchat("run", story, *COPY, "--max-tokens", "80", "--prediction", str(predicted), "--trace", str(trace))
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    steps = [t.event for t in read_trace(trace)[1] if isinstance(t.event, Step)]
    reports = {s.pass_report.number: s.pass_report for s in steps if s.pass_report}
    assert reports and all(r.source == "prediction" for r in reports.values())
    assert sum(r.kept for r in reports.values()) == sum(r.drafted for r in reports.values()) > 0
    assert "drafted (100%)" in again.stderr


def test_run_prediction_s_one_line_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    one_line_error(loopchat("run", "Hi", "--prediction", str(tmp_path / "none.txt")), "--prediction", "cannot read")
    one_line_error(loopchat("run", "Hi", "--prediction", str(empty)), "is empty")
    empty.write_text("Hello!", encoding="utf-8")
    one_line_error(loopchat("run", "Hi", "-n", "2", "--prediction", str(empty)), "leave out --prediction")


def test_a_prediction_goes_to_a_server_as_openai_s_field() -> None:
    from loopchat.backends.remote import RemoteBackend
    from loopchat.events import Message
    from loopchat.request import ReplyRequest
    from loopchat.settings import SamplingSettings

    backend = RemoteBackend("http://127.0.0.1:9/v1", model_id="m", extensions=False)
    try:
        _, body, _ = backend.request(ReplyRequest((Message("user", "hi"),), SamplingSettings(), prediction="a cat"))
        assert body["prediction"] == {"type": "content", "content": "a cat"}
        _, plain, _ = backend.request(ReplyRequest((Message("user", "hi"),), SamplingSettings()))
        assert "prediction" not in plain
    finally:
        backend.close()
