"""`loopchat serve` in a child process for the tests (test_serve.py, test_serve_clients.py):
a real server on 127.0.0.1 at a free port (--port 0), its URL read from the line it
prints when it listens, its log lines (stderr) as they come."""

from __future__ import annotations

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
