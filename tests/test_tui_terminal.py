"""The app in a real pseudo-terminal: a signal must give the terminal back as Ctrl+Q does."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TRACE = Path(__file__).parent / "data" / "reply.jsonl"

ALT_SCREEN_ON, ALT_SCREEN_OFF = b"\x1b[?1049h", b"\x1b[?1049l"
MOUSE_OFF = b"\x1b[?1000l"
CURSOR_SHOWN = b"\x1b[?25h"


def read_until(fd: int, proc: subprocess.Popen, needle: bytes | None, timeout: float) -> bytes:
    """What the app writes to the terminal, until `needle` appears (None: until it exits)."""
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the app closed the terminal (it exited)
                break
            if not chunk:
                break
            out += chunk
            if needle is not None and needle in out:
                return out
        elif needle is None and proc.poll() is not None:
            break
    if needle is not None:
        raise AssertionError(f"{needle!r} not written within {timeout} s; got {out[-300:]!r}")
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_restores_the_terminal(sig: signal.Signals) -> None:
    controller, terminal = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopchat", "replay", str(TRACE), "--speed", "0"],
        stdin=terminal, stdout=terminal, stderr=terminal, env=env, start_new_session=True,
    )
    os.close(terminal)
    try:
        read_until(controller, proc, b"Assistant", 60)  # the app is up and has drawn the reply
        proc.send_signal(sig)
        rest = read_until(controller, proc, None, 30)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(controller)
    assert ALT_SCREEN_OFF in rest  # back on the main screen
    assert MOUSE_OFF in rest  # mouse reporting off
    assert CURSOR_SHOWN in rest  # the cursor visible again
