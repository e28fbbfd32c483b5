"""`loopchat web` in a child process and Debian's chromium driven by Playwright, for
tests/test_web.py: the server on 127.0.0.1 at a free port (--port 0) with its own data
folder, its URL read from the line it prints; the terminal's text read from xterm.js's
buffer in the page."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
#: without the background-networking flags, chromium's own connections are refused by a
#: closed network and slow it down; Playwright's own browser download is never used
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

#: textual-serve's page keeps its xterm.js Terminal in a closure; this hook, run before the
#: page's scripts, keeps the object that owns it (the first to set `fitAddon`) in a global
HOOK = """
Object.defineProperty(Object.prototype, "fitAddon", {
  configurable: true,
  get() { return undefined; },
  set(v) {
    Object.defineProperty(this, "fitAddon", {value: v, writable: true, configurable: true});
    window.__loopchatTerminal = this;
  },
});
"""
#: the terminal's text, row by row, as xterm.js holds it
TEXT = """() => {
  const owner = window.__loopchatTerminal;
  if (!owner || !owner.terminal) return "";
  const buffer = owner.terminal.buffer.active;
  const rows = [];
  for (let i = 0; i < buffer.length; i++) {
    const line = buffer.getLine(i);
    rows.push(line ? line.translateToString(true) : "");
  }
  return rows.join("\\n");
}"""


def wait_until(what: str, check: Callable[[], Any], timeout: float, last: Callable[[], str] = lambda: "") -> Any:
    """Poll `check` until it returns something true (returned), or fail after `timeout`
    seconds saying what was awaited and, from `last`, what was there instead."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last seen:\n{last()}")
        time.sleep(0.1)


class Web:
    """`loopchat web --port 0` in a child process, its data in `home` (history, config).
    `max_tokens`: the replies' length (a models.toml of its own in `home`; short replies
    stay whole on the tab's screen); None: the default model's own settings."""

    def __init__(self, home: Path, *args: str, max_tokens: int | None = 40, timeout: float = 60.0) -> None:
        if max_tokens is not None:
            (home / "config").mkdir(parents=True, exist_ok=True)
            (home / "config" / "models.toml").write_text(
                'default = "smollm2"\n[models.smollm2]\nbuiltin = "smollm2-135m-instruct"\n'
                f"[models.smollm2.sampling]\nmax_tokens = {max_tokens}\n"
            )
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / "xdg-config"),
            "XDG_DATA_HOME": str(home / "xdg-data"),
            "LOOPCHAT_CONFIG_DIR": str(home / "config"),
            "LOOPCHAT_DATA_DIR": str(home / "data"),
            "LOOPCHAT_LOG_DIR": str(home / "log"),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "loopchat", "web", "--port", "0", "--threads", "1", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True).start()
        line = wait_until("the start line", lambda: self._match(r"open (http://\S+) in a browser"), timeout, self.tail)
        self.url = line.group(1)

    def _read(self, stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def _match(self, pattern: str) -> re.Match | None:
        return next((m for line in list(self.out) if (m := re.search(pattern, line))), None)

    def logged(self, pattern: str) -> re.Match | None:
        return next((m for line in list(self.err) if (m := re.search(pattern, line))), None)

    def tail(self) -> str:
        return "stdout: " + "\n".join(self.out[-5:]) + "\nstderr: " + "\n".join(self.err[-20:])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def terminal_text(page: Any) -> str:
    return page.evaluate(TEXT)


def open_tab(context: Any, url: str) -> Any:
    """A new tab on the chat's page; returns it once the app's first screen is drawn."""
    page = context.new_page()
    page.goto(url, wait_until="domcontentloaded", timeout=30_000)
    wait_until("the app's screen", lambda: "Loop" in terminal_text(page), 60, lambda: terminal_text(page))
    return page


def wait_text(page: Any, what: str, check: Callable[[str], Any], timeout: float = 60.0) -> Any:
    """Wait until `check(text of the terminal)` is true; returns its value."""
    return wait_until(what, lambda: check(terminal_text(page)), timeout, lambda: terminal_text(page))


def send(page: Any, text: str) -> None:
    """Type a message into the chat (the terminal has the keyboard's focus) and send it."""
    page.focus(".xterm-helper-textarea")
    page.keyboard.type(text)
    page.keyboard.press("Enter")
