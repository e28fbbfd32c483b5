"""`loopchat run` and friends, as a user runs them: a real subprocess on the real model."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loopchat.trace import read_trace

pytestmark = [pytest.mark.model, pytest.mark.server]

PY = sys.executable


def loopchat(
    *args: str, input: str | None = None, env: dict | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
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


#: the one `loopchat run` with a trace that several tests read (each started its own:
#: a process that loads the model is ~1.3 s of CPU); LOOPCHAT_THREADS given for its process,
#: as test_loopchat_threads_stands_for_the_threads_option_when_it_is_not_given reads it
RECORDED_ARGS = ("run", "Say hello.", "--max-tokens", "12", "--seed", "4")


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    trace = tmp_path_factory.mktemp("recorded") / "full.jsonl"
    proc = loopchat(*RECORDED_ARGS, "--trace", str(trace), env={"LOOPCHAT_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    return proc, trace


def test_run_streams_and_ends_with_a_summary(recorded_run) -> None:
    proc, _ = recorded_run
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


def test_trace_records_everything_needed_to_recheck_a_run(recorded_run, model_path: Path) -> None:
    proc, trace = recorded_run
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
    assert start.settings.seed == 4
    steps = [te.event for te in events if te.event.kind == "step"]
    assert steps and all(s.settings.max_tokens == 12 for s in steps)
    assert events[-1].event.text == "".join(s.text for s in steps)
    assert proc.stdout.rstrip("\n") == events[-1].event.text.rstrip("\n")
    times = [te.t_ms for te in events]
    assert times == sorted(times)


def test_stop_ends_the_reply_before_the_text() -> None:
    args = (
        "run",
        "Count from 1 to 20, separated by commas.",
        "--seed",
        "1",
        "--temperature",
        "0",
        "--max-tokens",
        "30",  # "7" is token 24 of the free reply
    )
    free = loopchat(*args)
    assert free.returncode == 0 and "7" in free.stdout, free.stdout
    stopped = loopchat(*args, "--stop", "7", "--stop", "nineteen")
    assert stopped.returncode == 0, stopped.stderr
    # the same tokens up to the stop string; it and what follows are not printed
    assert stopped.stdout.rstrip("\n") == free.stdout[: free.stdout.index("7")].rstrip("\n")
    assert stopped.stderr.strip().endswith("finish: stop")


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
        (("run", "hi", "--repeat-last-n", "-1"), ("repeat_last_n", "between 0 and 100000")),
        (("run", "hi", "--dry-penalty-last-n", "-1"), ("dry_penalty_last_n", "between 0 and 100000")),
        (("run", "hi", "--model", "nope"), ("nope",)),
        (("run", "   "), ("empty",)),
        (("run", "hi", "--config", "/nonexistent/models.toml"), ("/nonexistent/models.toml",)),
        (("run", "hi", "--temperature", "warm"), ("--temperature",)),
        (("frobnicate",), ("frobnicate",)),
        (("--host", "gpu"), ("--host", "thread", "process")),
        (("run", "hi", "--stop", ""), ("--stop", "not empty")),
        (
            ("run", "hi", *("--stop", "a") * 2, *("--stop", "b", "--stop", "c", "--stop", "d", "--stop", "e")),
            ("--stop", "up to 4"),
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needles) -> None:
    assert_one_line_error(loopchat(*args), *needles)


def test_every_sampling_setting_has_a_run_flag(capsys) -> None:
    # in-process: the flags are made from settings.SETTINGS (--repeat-last-n was missing)
    from loopchat.cli.main import build_parser
    from loopchat.cli.run import settings_from_args
    from loopchat.settings import SETTINGS, SamplingSettings

    argv = ["run", "hi"]
    numbers = [spec for spec in SETTINGS if spec.type in (int, float)]
    for spec in numbers:
        argv += [spec.flag, str(spec.lo + 1)]
    settings = settings_from_args(SamplingSettings(), build_parser().parse_args(argv))
    assert settings.to_dict() == {spec.name: spec.lo + 1 for spec in numbers}
    # a setting of its own kind (the logit bias) takes its texts, repeatable: the model's
    # tokenizer makes them token ids once it is loaded (tests/test_run_logit_bias.py)
    for spec in SETTINGS:
        if spec.type is tuple:
            args = build_parser().parse_args(["run", "hi", spec.flag, " a=1", spec.flag, "b=-2"])
            assert getattr(args, spec.name) == [" a=1", "b=-2"]
    args = build_parser().parse_args(["run", "hi", "--repeat-last-n", "8"])
    assert settings_from_args(SamplingSettings(seed=3), args) == SamplingSettings(seed=3, repeat_last_n=8)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    help_text = capsys.readouterr().out
    assert all(spec.flag in help_text and spec.hint.split()[0] in help_text for spec in SETTINGS)


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
        [
            PY,
            "-m",
            "loopchat",
            "run",
            "Count from 1 to 1000, one number per line.",
            "--max-tokens",
            "2000",
            "--seed",
            "1",
        ],
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


@pytest.mark.parametrize("delay", [0.3, 1.0])
def test_ctrl_c_before_the_reply_starts_says_nothing_of_a_partial_reply(delay: float) -> None:
    # while Python starts, the model loads or the prompt is prefilled: whichever the
    # signal meets, one exit code and no word of a reply that was never printed
    # a reply that runs for ~2000 tokens (this seed at T=1 does not stop early), so the
    # signal always comes before its end
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "loopchat",
            "run",
            "Write a very long story about a dragon, at least 2000 words.",
            "--max-tokens",
            "2000",
            "--temperature",
            "1.0",
            "--top-k",
            "0",
            "--top-p",
            "1",
            "--min-p",
            "0",
            "--seed",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(delay)  # no event to await: the point is to land anywhere in the start-up
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    if not out.strip():
        assert "partial" not in err, err


def test_host_option_picks_where_the_chat_runs_the_model(monkeypatch) -> None:
    from loopchat.cli import main as cli
    from loopchat.tui import launch as tui_app

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


def loopchat_bytes(
    *args: str | bytes, input: bytes | None = None, env: dict | None = None, **kw
) -> subprocess.CompletedProcess:
    """`loopchat` with raw bytes on stdin and in argv; stdout and stderr decoded leniently."""
    proc = subprocess.run(
        [PY, "-m", "loopchat", *args],
        capture_output=True,
        input=input,
        env={**os.environ, **(env or {})},
        timeout=120,
        **kw,
    )
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")
    )


LOCALES = [
    {},
    {"LC_ALL": "C"},
    {"LC_ALL": "C.UTF-8"},
    {"LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8:strict"},
    {"LC_ALL": "C", "PYTHONIOENCODING": "ascii"},
    {"PYTHONIOENCODING": "latin-1", "PYTHONUTF8": "0"},
]


@pytest.mark.parametrize("env", LOCALES, ids=lambda env: ",".join(f"{k}={v}" for k, v in env.items()) or "inherited")
def test_a_prompt_that_is_not_utf8_is_one_line_in_any_locale(env: dict) -> None:
    # was: exit 0 and nothing printed (the engine's error came after the run's end), or a
    # UnicodeDecodeError traceback in a strict UTF-8 locale
    proc = loopchat_bytes("run", "-", input=b"caf\xe9 au lait", env=env)
    assert_one_line_error(proc, "standard input", "not UTF-8", "0xe9", "offset 3")
    arg = loopchat_bytes("run", b"caf\xe9", env=env)
    assert_one_line_error(arg, "prompt", "not UTF-8", "offset 3")


def test_an_internal_engine_error_is_one_line_and_a_nonzero_exit() -> None:
    # a bug inside the engine, injected where no model is involved: before, `run` stopped
    # reading at the run's end, which the worker emitted before the error: exit 0, silent
    code = (
        "import sys; import loopchat.engine.engine as e\n"
        "def broken(self, messages, max_tokens): raise RuntimeError('injected fault')\n"
        "e.Engine.fit_prompt = broken\n"
        "from loopchat.cli.main import main; sys.exit(main(['run', 'hi']))\n"
    )
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("loopchat: internal error while generating: RuntimeError: injected fault")
    assert "report" in lines[0]


def _small_context_config(tmp_path: Path, n_ctx: int) -> Path:
    cfg = tmp_path / "models.toml"
    # one llama thread: 2 OpenMP threads on a busy 2-core machine can be 100x slower
    cfg.write_text(
        f'default = "small"\n[models.small]\nbuiltin = "smollm2-135m-instruct"\nn_ctx = {n_ctx}\nthreads = 1\n'
    )
    return cfg


def test_a_reply_longer_than_an_unpadded_context_stops_at_the_context(tmp_path: Path) -> None:
    # n_ctx = 300: llama.cpp pads its context to 512, llama-cpp-python's token buffer keeps
    # 300 slots. Was: an IndexError at token 300, the reply cut mid-word with exit 0.
    # A long prompt (272 tokens) leaves the reply ~30 of the 300: a prefill of the prompt
    # costs less than drawing its tokens one by one (-1.1 s of CPU against a 48-token prompt)
    cfg = _small_context_config(tmp_path, 300)
    trace = tmp_path / "t.jsonl"
    notes = "The dragon sleeps under the hill and wakes at night. " * 18
    proc = loopchat(
        "run",
        f"Here are my notes on the dragon. {notes}Write a very long story about this dragon, at least 2000 words.",
        "--config",
        str(cfg),
        "--max-tokens",
        "1000",
        "--temperature",
        "1.0",
        "--top-k",
        "0",
        "--top-p",
        "1",
        "--min-p",
        "0",
        "--repeat-penalty",
        "1",
        "--seed",
        "1",
        "--trace",
        str(trace),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("finish: context"), proc.stderr
    _, events = read_trace(trace)
    start, finish = events[0].event, events[-1].event
    assert start.n_ctx == finish.n_ctx == 300
    assert finish.reason == "context" and finish.n_past == 299
    assert finish.prompt_tokens + finish.completion_tokens == 300 and finish.completion_tokens >= 10
    assert proc.stdout.rstrip("\n") == finish.text.rstrip("\n")


@pytest.mark.parametrize("max_tokens", ["2", "40"])  # the trace's buffer fails at close / mid-run
def test_a_trace_that_cannot_be_written_is_one_line_and_the_reply_still_printed(max_tokens: str) -> None:
    proc = loopchat("run", "Name three planets.", "--max-tokens", max_tokens, "--seed", "2", "--trace", "/dev/full")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.strip()  # the reply
    summary, error = proc.stderr.strip().splitlines()
    assert "finish: " in summary and "finish: cancelled" not in summary
    assert error.startswith("loopchat: cannot write the trace file /dev/full (No space left on device)")


def test_a_disk_that_fills_mid_run_leaves_a_trace_read_as_cut_short(tmp_path: Path) -> None:
    import resource

    trace = tmp_path / "t.jsonl"
    limit = 20_000  # bytes: a few steps in; past it the kernel refuses writes (EFBIG)
    proc = subprocess.run(
        [
            PY,
            "-m",
            "loopchat",
            "run",
            "Count from 1 to 1000, one number per line.",
            "--max-tokens",
            "60",
            "--seed",
            "2",
            "--trace",
            str(trace),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.strip() and "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(f"loopchat: cannot write the trace file {trace} (File too large)")
    )
    assert trace.stat().st_size == limit  # the file ends mid-line
    header, events = read_trace(trace)
    assert header["cut_short"] is True
    last = events[-1]
    assert last.synthetic and last.event.kind == "finish" and last.event.reason == "error"
    assert "cut short" in last.event.error
    steps = [te.event for te in events if te.event.kind == "step"]
    assert steps and last.event.text == "".join(s.text for s in steps)
    assert proc.stdout.startswith(last.event.text)


def test_stdout_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [PY, "-m", "loopchat", "run", "Name three planets.", "--max-tokens", "30", "--seed", "2"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("loopchat: cannot write the reply to standard output (No space left on device)")
    assert "finish: cancelled" in proc.stderr  # it stopped generating what nobody could read


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


def test_a_trace_cut_short_ends_its_reply_with_an_error_finish(recorded_run, tmp_path: Path) -> None:
    from loopchat.trace import CUT_SHORT

    recorded = recorded_run[1]
    lines = recorded.read_text().splitlines(keepends=True)
    assert json.loads(lines[-1])["kind"] == "finish"
    _, whole = read_trace(recorded)
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
    for name in ("ttft_ms", "decode_ms"):  # from the steps' clock readings
        assert getattr(f, name) == pytest.approx(getattr(real, name), abs=5), name
    # the total ends at the last step's clock reading, short of the real one by the time the reply took to
    # finish after it (the trace's gap; 50 ms slack: beside a second test worker the trace read the step late)
    assert f.total_ms == [te.event for te in whole if te.event.kind == "step"][-1].elapsed_ms
    after_last_step = whole[-1].t_ms - whole[-2].t_ms
    assert -1 <= real.total_ms - f.total_ms <= after_last_step + 50, (real.total_ms, f.total_ms, after_last_step)

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


def test_a_bad_chat_template_names_the_model_and_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "models.toml"
    cfg.write_text(
        'default = "x"\n[models.x]\nbuiltin = "smollm2-135m-instruct"\n'
        'chat_template = "{% for m in messages %}{{ m.content }"\n'
    )
    for args in (("run", "hi", "--config", str(cfg)), ("models", "--config", str(cfg))):
        assert_one_line_error(
            loopchat(*args), f"{cfg}: models.x.chat_template is not a valid Jinja template (line 1: unexpected '}}')"
        )


def test_a_template_that_fails_to_render_is_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "models.toml"
    cfg.write_text(
        'default = "x"\n[models.x]\nbuiltin = "smollm2-135m-instruct"\n'
        "chat_template = \"{{ raise_exception('this template wants no system prompt') }}\"\n"
    )
    assert_one_line_error(loopchat("run", "hi", "--config", str(cfg)), "chat template", "wants no system prompt")


def test_stdin_with_data_and_a_prompt_argument_is_refused(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b"the piped prompt\n")
    os.close(write_end)
    try:
        piped = subprocess.run(
            [PY, "-m", "loopchat", "run", "hello"], stdin=read_end, capture_output=True, text=True, timeout=60
        )
    finally:
        os.close(read_end)
    assert_one_line_error(piped, "standard input", "pass -")
    data = tmp_path / "prompt.txt"
    data.write_text("the prompt in a file\n")
    with open(data) as f:
        from_file = subprocess.run(
            [PY, "-m", "loopchat", "run", "hello"], stdin=f, capture_output=True, text=True, timeout=60
        )
    assert_one_line_error(from_file, "standard input", "pass -")


def test_an_idle_stdin_does_not_stop_a_prompt_argument(tmp_path: Path) -> None:
    # a harness's stdin: /dev/null, an empty file, or a pipe nobody writes to (and never closes)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    read_end, write_end = os.pipe()
    try:
        with open(empty) as f:
            for stdin in (subprocess.DEVNULL, f, read_end):
                proc = subprocess.run(
                    [PY, "-m", "loopchat", "run", "Say yes.", "--max-tokens", "2", "--seed", "1"],
                    stdin=stdin,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert proc.returncode == 0, (stdin, proc.stderr)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_ctrl_c_while_the_trace_is_written_keeps_a_finished_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "loopchat",
            "run",
            "Count from 1 to 1000, one number per line.",
            "--max-tokens",
            "2000",
            "--seed",
            "1",
            "--trace",
            str(trace),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.read(1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == "loopchat: interrupted (Ctrl+C): the reply above is partial"
    header, events = read_trace(trace)
    assert "cut_short" not in header
    assert events[-1].event.reason == "cancelled" and not events[-1].synthetic


def test_a_reply_the_output_encoding_cannot_spell_is_printed_not_a_traceback() -> None:
    # was: UnicodeEncodeError at the first "é" of the reply
    proc = loopchat(
        "run", "Say the word café twice.", "--max-tokens", "30", "--temperature", "0", env={"PYTHONIOENCODING": "ascii"}
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "caf?" in proc.stdout  # the reply, with ? for what ascii cannot spell


def test_model_path_needs_no_models_toml(tmp_path: Path, model_path: Path) -> None:
    copy = tmp_path / "my models" / "copy.gguf"  # another path, with a space in it
    copy.parent.mkdir()
    shutil.copyfile(model_path, copy)
    proc = loopchat("run", "Say hi.", "--model", str(copy), "--max-tokens", "8", "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and "finish: " in proc.stderr
    # the chat's backend takes the same path
    from loopchat.backends.live import LiveBackend

    backend = LiveBackend(None, str(copy), threads=1)
    try:
        assert backend.spec.source == "path" and backend.spec.location == str(copy)
        assert backend.resolve()[1] == copy
    finally:
        backend.close()


@pytest.mark.parametrize("kind", ["missing", "directory", "not gguf"])
def test_a_bad_model_path_is_one_line(tmp_path: Path, kind: str) -> None:
    path = {"missing": tmp_path / "nowhere.gguf", "directory": tmp_path, "not gguf": tmp_path / "notes.gguf"}[kind]
    if kind == "not gguf":
        path.write_text("these are my notes, not a model\n")
    proc = loopchat("run", "hi", "--model", str(path))
    assert_one_line_error(proc, str(path), "--model")


def test_threads_option_pins_or_lets_auto_choose(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    pinned = loopchat("run", "Hi", "--max-tokens", "6", "--seed", "2", "--threads", "1", "--trace", str(trace))
    assert pinned.returncode == 0, pinned.stderr
    assert " · threads 1 · " in pinned.stderr
    _, events = read_trace(trace)
    assert events[0].event.threads == 1 and not events[0].event.threads_auto
    assert {e.event.threads for e in events if e.event.kind == "step"} == {1}
    # the default: auto (conftest.py sets LOOPCHAT_THREADS=1 for the tests' processes; empty is unset)
    auto = loopchat(
        "run", "Hi", "--max-tokens", "6", "--seed", "2", "--trace", str(trace), env={"LOOPCHAT_THREADS": ""}
    )
    assert auto.returncode == 0, auto.stderr
    assert re.search(r" · threads \d auto( \(\d–\d used\))? · ", auto.stderr), auto.stderr
    _, events = read_trace(trace)
    assert events[0].event.threads_auto
    steps = [e.event for e in events if e.event.kind == "step"]
    assert steps[0].threads_reason and all(s.threads >= 1 for s in steps)


def test_loopchat_threads_stands_for_the_threads_option_when_it_is_not_given(recorded_run) -> None:
    """LOOPCHAT_THREADS=N pins the threads as --threads N would (the README's models list);
    a value that is neither auto nor a count is one line that names the variable."""
    pinned, trace = recorded_run  # run with LOOPCHAT_THREADS=1 and no --threads
    env = {"LOOPCHAT_THREADS": "1"}
    assert "--threads" not in RECORDED_ARGS
    assert pinned.returncode == 0, pinned.stderr
    assert " · threads 1 · " in pinned.stderr
    _, events = read_trace(trace)
    assert events[0].event.threads == 1 and not events[0].event.threads_auto
    # run, serve and the chat each read it (a bad value stops them before the model loads)
    for command in (("run", "Hi", "--max-tokens", "4"), ("serve", "--port", "0"), ()):
        bad = loopchat(*command, input="", env={"LOOPCHAT_THREADS": "many"}, timeout=60)
        assert_one_line_error(bad, "LOOPCHAT_THREADS", "'many'", "unset it")
    # a model on a server has no threads here: the variable is not --threads given there
    remote = loopchat("run", "Hi", "--url", "http://127.0.0.1:9/v1", env=env, timeout=60)
    assert remote.returncode != 0 and "threads" not in remote.stderr, remote.stderr


@pytest.mark.parametrize("value", ["0", "two", "-3"])
def test_threads_option_rejects_bad_values(value: str) -> None:
    proc = loopchat("run", "Hi", "--threads", value)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and '"auto" or a whole number' in proc.stderr, proc.stderr


def test_run_continues_a_document_for_a_model_whose_mode_is_completion(tmp_path: Path) -> None:
    from loopchat.trace import read_trace

    cfg = tmp_path / "models.toml"
    cfg.write_text('default = "doc"\n[models.doc]\nbuiltin = "smollm2-135m-instruct"\nmode = "completion"\n')
    trace = tmp_path / "t.jsonl"
    proc = loopchat(
        "run", "Once upon a time", "--config", str(cfg), "--max-tokens", "3", "--seed", "1", "--trace", str(trace)
    )
    assert proc.returncode == 0, proc.stderr
    _, events = read_trace(trace)
    start = events[0].event
    assert start.prompt_text == "Once upon a time" and start.messages[0].role == "document"
    assert_one_line_error(loopchat("run", "hi", "--config", str(cfg), "--system", "x"), 'mode = "completion"')
