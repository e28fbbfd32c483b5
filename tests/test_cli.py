"""`loopchat run` and friends, as a user runs them: a real subprocess on the real model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loopchat.trace import read_trace

PY = sys.executable


def loopchat(*args: str, input: str | None = None, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [PY, "-m", "loopchat", *args], capture_output=True, text=True, input=input, env=full_env, timeout=timeout
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("loopchat: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_run_streams_and_ends_with_a_summary() -> None:
    proc = loopchat("run", "Say hello in five words.", "--seed", "1", "--max-tokens", "24")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    summary = proc.stderr.strip().splitlines()
    assert len(summary) == 1, proc.stderr  # llama.cpp's log never reaches the terminal
    for part in ("prompt ", "prefill ", "TTFT ", " tok/s", "finish: "):
        assert part in summary[0]


def test_blocking_and_streaming_print_the_same_reply() -> None:
    args = ("run", "Name three planets.", "--seed", "7", "--temperature", "0.9", "--max-tokens", "40")
    streamed = loopchat(*args)
    blocked = loopchat(*args, "--blocking")
    assert streamed.returncode == blocked.returncode == 0
    assert streamed.stdout == blocked.stdout
    assert streamed.stdout.strip()


def test_prompt_from_stdin_and_show_steps() -> None:
    proc = loopchat("run", "-", "--show-steps", "--max-tokens", "5", "--seed", "1", input="Say yes.")
    assert proc.returncode == 0, proc.stderr
    step_lines = [line for line in proc.stdout.splitlines() if "p=" in line and "rank" in line and " ms" in line]
    assert 1 <= len(step_lines) <= 5


def test_trace_records_everything_needed_to_recheck_a_run(tmp_path: Path, model_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    proc = loopchat("run", "Hi there", "--max-tokens", "8", "--seed", "3", "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr
    first = json.loads(trace.read_text().splitlines()[0])
    assert first["kind"] == "header" and first["schema_version"] == 1
    header, events = read_trace(trace)
    kinds = [te.event.kind for te in events]
    assert kinds[0] == "start" and kinds[1] == "prefill" and kinds[-1] == "finish"
    start = events[0].event
    assert start.model_path == str(model_path)
    assert start.model_size_bytes == model_path.stat().st_size
    assert start.prompt_text.endswith("<|im_start|>assistant\n")
    assert len(start.prompt_token_ids) > 5
    assert start.settings.seed == 3
    steps = [te.event for te in events if te.event.kind == "step"]
    assert steps and all(s.settings.max_tokens == 8 for s in steps)
    assert events[-1].event.text == "".join(s.text for s in steps)
    assert proc.stdout.rstrip("\n") == events[-1].event.text.rstrip("\n")
    times = [te.t_ms for te in events]
    assert times == sorted(times)


def test_models_lists_the_builtin_model() -> None:
    proc = loopchat("models")
    assert proc.returncode == 0, proc.stderr
    assert "smollm2-135m-instruct" in proc.stdout


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("run", "hi", "--temperature", "9"), ("temperature", "between")),
        (("run", "hi", "--top-p", "0"), ("top_p",)),
        (("run", "hi", "--max-tokens", "0"), ("max_tokens",)),
        (("run", "hi", "--model", "nope"), ("nope",)),
        (("run", "   "), ("empty",)),
        (("run", "hi", "--config", "/nonexistent/models.toml"), ("/nonexistent/models.toml",)),
        (("run", "hi", "--temperature", "warm"), ("--temperature",)),
        (("frobnicate",), ("frobnicate",)),
        (("--host", "gpu"), ("--host", "thread", "process")),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needles) -> None:
    assert_one_line_error(loopchat(*args), *needles)


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "models.toml"
    cfg.write_text("default = \n[models\n")
    assert_one_line_error(loopchat("run", "hi", "--config", str(cfg)), str(cfg))


def _config_with_path(tmp_path: Path, model: Path) -> Path:
    cfg = tmp_path / "models.toml"
    cfg.write_text(f'default = "m"\n[models.m]\npath = "{model}"\n')
    return cfg


def test_missing_model_file(tmp_path: Path) -> None:
    cfg = _config_with_path(tmp_path, tmp_path / "gone.gguf")
    assert_one_line_error(loopchat("run", "hi", "--config", str(cfg)), "gone.gguf")


def test_corrupt_model_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a model" * 100)
    cfg = _config_with_path(tmp_path, bad)
    assert_one_line_error(loopchat("run", "hi", "--config", str(cfg)), "bad.gguf")


def test_truncated_model_file(tmp_path: Path, model_path: Path) -> None:
    bad = tmp_path / "truncated.gguf"
    with open(model_path, "rb") as f:
        bad.write_bytes(f.read(2_000_000))  # valid magic and header, missing tensors
    cfg = _config_with_path(tmp_path, bad)
    assert_one_line_error(loopchat("run", "hi", "--config", str(cfg)), "truncated.gguf")


def test_a_prompt_longer_than_the_context(tmp_path: Path, model_path: Path) -> None:
    cfg = tmp_path / "models.toml"
    cfg.write_text(f'default = "m"\n[models.m]\npath = "{model_path}"\nn_ctx = 128\n')
    proc = loopchat("run", "word " * 400, "--config", str(cfg))
    assert_one_line_error(proc, "context", "n_ctx")


def test_ctrl_c_mid_generation_is_one_line_and_keeps_the_partial_reply() -> None:
    proc = subprocess.Popen(
        [PY, "-m", "loopchat", "run", "Count from 1 to 1000, one number per line.", "--max-tokens", "2000", "--seed", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.read(1)  # the reply has started streaming
    assert first
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "Traceback" not in err
    assert "interrupted" in err
    assert "finish: cancelled" in err
    assert len(first + out) > 0


def test_host_option_picks_where_the_chat_runs_the_model(monkeypatch) -> None:
    from loopchat import cli
    from loopchat.tui import app as tui_app

    seen = []
    monkeypatch.setattr(tui_app, "run_tui", lambda **kw: seen.append(kw["host"]) or 0)
    assert cli.main(["--host", "process"]) == 0 and cli.main([]) == 0
    assert seen == ["process", None]
    for host, worker in (("process", "ProcessEngineWorker"), (None, "EngineWorker")):
        app = tui_app.create_app(host=host)
        try:
            assert type(app.backend.worker).__name__ == worker
        finally:
            app.backend.close()


# --- issue 15: what a new user hits -------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "where", "needles"),
    [
        ("[1, 2]", 1, ("not a loopchat trace", "an array")),
        ('"header"', 1, ("not a loopchat trace", "a string")),
        ("42", 2, ("not a loopchat trace", "a number")),
        ('{"kind": "step", "index": 0}', 2, ("bad event",)),
        ('{"kind": "start", "settings": {"temperature": 99}}', 2, ("bad event", "temperature")),
    ],
)
def test_a_file_that_is_not_a_trace_is_one_line_naming_the_file_and_line(tmp_path: Path, line, where, needles) -> None:
    bad = tmp_path / "bad.jsonl"
    header = '{"kind": "header", "schema_version": 1}'
    bad.write_text((line if where == 1 else header + "\n" + line) + "\n")
    assert_one_line_error(loopchat("replay", str(bad)), f"{bad}:{where}: ", *needles)


def _recorded_trace(tmp_path: Path) -> Path:
    trace = tmp_path / "full.jsonl"
    proc = loopchat("run", "Say hello.", "--max-tokens", "12", "--seed", "4", "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr
    return trace


def test_a_trace_cut_short_ends_its_reply_with_an_error_finish(tmp_path: Path) -> None:
    from loopchat.trace import CUT_SHORT

    lines = _recorded_trace(tmp_path).read_text().splitlines(keepends=True)
    assert json.loads(lines[-1])["kind"] == "finish"
    _, whole = read_trace(tmp_path / "full.jsonl")
    assert not any(te.synthetic for te in whole)
    real = whole[-1].event

    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:-1]))  # at a line boundary: no finish event
    header, events = read_trace(cut)
    assert header["cut_short"] is True
    finish = events[-1]
    assert finish.synthetic and finish.t_ms == events[-2].t_ms
    f = finish.event
    assert f.reason == "error" and f.error == CUT_SHORT
    for name in ("prompt_tokens", "completion_tokens", "steps", "text", "n_past", "n_ctx", "prefill_ms"):
        assert getattr(f, name) == getattr(real, name), name
    for name in ("ttft_ms", "decode_ms", "total_ms"):  # from the steps' clock readings
        assert getattr(f, name) == pytest.approx(getattr(real, name), abs=5), name

    mid_line = tmp_path / "mid.jsonl"
    mid_line.write_text("".join(lines[:-2]) + lines[-2][: len(lines[-2]) // 2])  # cut inside a step
    _, events = read_trace(mid_line)
    assert events[-1].synthetic and events[-1].event.steps == real.steps - 1

    # a second reply after one that never finished: the first gets its finish before the next start
    two = tmp_path / "two.jsonl"
    two.write_text("".join(lines[:-1]) + "".join(lines[1:]))
    _, events = read_trace(two)
    finishes = [te for te in events if te.event.kind == "finish"]
    assert [te.synthetic for te in finishes] == [True, False]
    assert [te.event.kind for te in events].count("start") == 2
    assert events[events.index(finishes[0]) + 1].event.kind == "start"
