"""`loopchat serve` in a child process for the tests (test_serve.py, test_serve_clients.py,
test_serve_responses.py): a real server on 127.0.0.1 at a free port (--port 0), its URL read
from the line it prints when it listens, its log lines (stderr) as they come; and what the
tutorial tests share: the small served model, its reference replies, a snippet run as its own
process."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

PY = sys.executable
LOG_WAIT = 60.0  # seconds a log line may take to appear (a busy 2-core machine)
KEY = "test-" + secrets.token_hex(8)  # the API key of the servers the tests start (LOOPCHAT_API_KEY)


class Serve:
    """`loopchat serve --port 0` in a child process: its URL (from the line it prints when
    it listens) and its stderr lines as they come."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120.0) -> None:
        self.proc = subprocess.Popen(
            [PY, "-m", "loopchat", "serve", "--port", "0", "--threads", "1", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True).start()
        line = self.wait_for(r"listening on (http://\S+)", self.out, timeout=timeout)
        self.url = line.group(1)

    def _read(self, stream: Any, into: list[str]) -> None:
        for line in stream:
            with self._changed:
                into.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            into.append("")  # (its end: wakes whoever waits)
            self._changed.notify_all()

    def wait_for(
        self, pattern: str, lines: list[str] | None = None, *, start: int = 0, timeout: float = LOG_WAIT
    ) -> re.Match:
        lines = self.err if lines is None else lines
        deadline = time.monotonic() + timeout
        seen = start
        with self._changed:
            while True:
                for i in range(seen, len(lines)):
                    m = re.search(pattern, lines[i])
                    if m:
                        return m
                seen = len(lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and lines and lines[-1] == ""):
                    raise AssertionError(
                        f"no line matching {pattern!r}; stdout: {self.out[-5:]}; stderr: {self.err[-10:]}"
                    )
                self._changed.wait(left)

    def client(self, key: str | None = None) -> OpenAI:
        return OpenAI(base_url=self.url + "/v1", api_key=key or "none", max_retries=0, timeout=120)

    def __enter__(self) -> Serve:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _node_missing() -> str | None:
    """Why the Node tutorial cannot run here (None: it can)."""
    if shutil.which("node") is None:
        return (
            "node is not installed: OpenAI's Node SDK tutorial against loopchat serve was not run "
            "(install Node.js 20+, then `make test` installs the SDK)"
        )
    if not (Path(__file__).parent / "clients" / "node_modules" / "openai" / "package.json").is_file():
        return (
            "OpenAI's Node SDK is not installed in tests/clients/node_modules: `make test` installs it "
            "(npm ci in tests/clients)"
        )
    return None


NODE_MISSING = _node_missing()


# ---- OpenAI's tutorial snippets (tests/clients/) against a server of the bundled model ------

SERVED = "tiny"  # the models.toml entry served: what every response's `model` must say
FILE_STEM = "SmolLM2-135M-Instruct.Q4_1"  # its model file's name, less .gguf
CLIENTS = Path(__file__).parent / "clients"
TINY_CONFIG = f"""default = "{SERVED}"
[models.{SERVED}]
builtin = "smollm2-135m-instruct"
threads = 1
[models.{SERVED}.sampling]
seed = 7
max_tokens = 40
"""


def tiny_server(folder: Path, *args: str) -> Serve:
    """A server of the bundled model as TINY_CONFIG sets it (its seed pinned), API key KEY;
    its models.toml written into `folder`."""
    config = folder / "models.toml"
    config.write_text(TINY_CONFIG, encoding="utf-8")
    return Serve("--config", str(config), *args, env={"LOOPCHAT_API_KEY": KEY})


def auth(**more: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}", **more}


#: reference_text's replies by (server, messages, more): a Python and a Node snippet send the same
_REFERENCES: dict[tuple[str, str, str], str] = {}


def reference_text(server: Serve, messages: list[dict[str, str]], **more: Any) -> str:
    """The chat endpoint's reply to `messages` (and `more` of its parameters) at the served
    model's settings (models.toml pins the seed), its prompt evaluated whole (`cache_prompt:
    false`): what a request that reused nothing of the KV cache gets. Asked once each."""
    key = (server.url, json.dumps(messages), json.dumps(more, sort_keys=True))
    if key not in _REFERENCES:
        body = {"messages": messages, "cache_prompt": False, "loopchat": False, **more}
        r = httpx.post(server.url + "/v1/chat/completions", headers=auth(), timeout=120, json=body)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == SERVED
        _REFERENCES[key] = r.json()["choices"][0]["message"]["content"]
    return _REFERENCES[key]


def node_json(server: Serve, script: str) -> Any:
    """Run tests/clients/`script` with Node, pointed at `server` (key KEY) through OPENAI_BASE_URL and
    OPENAI_API_KEY alone, as OpenAI's guides run; what it printed, read as JSON."""
    env = {**os.environ, "OPENAI_BASE_URL": server.url + "/v1", "OPENAI_API_KEY": KEY}
    node = shutil.which("node") or "node"
    done = subprocess.run([node, script], capture_output=True, text=True, timeout=120, env=env, cwd=CLIENTS)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def run_snippet(server: Serve, argv: list[str], route: str = "/v1/chat/completions", mode: str = "stream") -> str:
    """Run a tutorial snippet as its own process, pointed at `server` through the two
    environment variables only; what it printed. Its request (to `route`, as `mode`: stream or
    blocking) must reuse nothing of the KV cache (the request before it was a document that
    shares no first token), so that `reference_text` is the very reply it was sent."""
    r = httpx.post(
        server.url + "/v1/completions", headers=auth(), timeout=120, json={"prompt": "Zebras", "max_tokens": 1}
    )
    assert r.status_code == 200, r.text
    mark = len(server.err)
    env = {"OPENAI_BASE_URL": server.url + "/v1", "OPENAI_API_KEY": KEY}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=CLIENTS)
    assert done.returncode == 0, done.stderr[-2000:]
    line = server.wait_for(rf"POST {re.escape(route)} (\d+) · (.*)", start=mark)
    assert line.group(1) == "200" and line.group(2).startswith(f"{mode} ·") and "reused" not in line.group(2), (
        line.group(0)
    )
    return done.stdout
