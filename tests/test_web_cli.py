"""`loopchat web`'s command line without a browser: bad input is one line and exit code 2
(before any port is bound or tab started), the chat's options reach each tab's command,
and any address but this machine's own gets its one-line warning."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from loopchat.cli.main import build_parser, main
from loopchat.web.command import chat_command


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-sessions", "0"], "--max-sessions is how many tabs may run at once, 1 or more"),
        (["--public-url", "example.org"], "--public-url 'example.org': give a whole URL"),
        (["--model", "nosuch"], "unknown model 'nosuch'"),
        (["--port", "99999"], "99999 is not a port number"),
        (["--url", "ftp://x"], "--url: 'ftp://x' is not an http:// or https:// URL"),
        (["--api-key", " "], "--api-key is empty"),
        (["--host", "nosuch.invalid", "--port", "0"], "cannot listen on 'nosuch.invalid'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle, capsys) -> None:
    assert main(["web", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("loopchat: ") and needle in err, err
    assert "Traceback" not in err


def test_the_chats_options_reach_each_tabs_command() -> None:
    args = build_parser().parse_args(
        ["--host", "process", "web", "--host", "127.0.0.1", "--model", "my model", "--threads", "2"]
        + ["--mode", "completion", "--no-history", "--url", "http://127.0.0.1:9/v1", "--api-key", "secret"]
    )
    command = chat_command(args)
    assert command[:3] == [sys.executable, "-m", "loopchat"]
    assert shlex.split(shlex.join(command)) == command  # (the shell's command line keeps "my model" whole)
    pairs = dict(zip(command[3::2], command[4::2]))
    assert pairs["--model"] == "my model" and pairs["--threads"] == "2" and pairs["--host"] == "process"
    assert pairs["--mode"] == "completion" and pairs["--url"] == "http://127.0.0.1:9/v1"
    assert "--no-history" in command
    assert "secret" not in command  # the key goes in the environment, which ps does not show
    assert args.bind == "127.0.0.1"  # the page's address is web's own --host


@pytest.mark.server
@pytest.mark.parametrize(("host", "warned"), [("0.0.0.0", True), ("127.0.0.1", False)])
def test_an_address_open_to_the_network_is_warned_of(host, warned, tmp_path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopchat", "web", "--host", host, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        start = proc.stdout.readline()  # the start line: printed once the port listens
        assert start.startswith(f"loopchat web: open http://{host}:") and "up to 4 tabs at once" in start, start
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    lines = err.splitlines()
    assert lines[-1] == "loopchat web: stopped"
    warnings = [line for line in lines if "warning" in line]
    if warned:
        assert warnings == [
            f"loopchat web: warning: listening on {host}: anyone who can reach this machine can open the chat, "
            "run models on it and read its history (--host 127.0.0.1 keeps it to this machine)"
        ]
    else:
        assert warnings == []
