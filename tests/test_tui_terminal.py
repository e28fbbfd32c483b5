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

pytestmark = [pytest.mark.model, pytest.mark.server]

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
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=env,
        start_new_session=True,
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


def stored_user_messages(path: Path) -> list[str]:
    from loopchat.history.store import ConversationStore

    if not path.exists():
        return []
    with ConversationStore.open_reader(path) as store:
        return [n.content for c in store.list_conversations() for n in store.load(c.id).nodes if n.role == "user"]


def test_a_paste_holding_escape_sequences_arrives_whole_and_in_order(tmp_path: Path) -> None:
    """A bracketed paste with ESC sequences, line breaks, a tab and a BEL in it, written to
    the app's terminal in two pieces (split inside an escape sequence): the message
    stored is the pasted text, in order (Textual's parser took what followed an ESC as
    keys, before the paste: `A1 [ESC[31mred] B2` was stored as `^[31mred] B2A1 [`)."""
    pasted = "A1 [\x1b[31mred] B2\x1b[0m\nline two:\tok \x1b[1;2A up\x07\nthird [\x1b]0;title\x07 end"
    data = ("\x1b[200~" + pasted + "\x1b[201~").encode()
    cut = data.index(b"[31m") + 2  # inside an escape sequence of the paste
    controller, terminal = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40", "LOOPCHAT_DATA_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopchat", "--threads", "1"],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=env,
        start_new_session=True,
    )
    os.close(terminal)
    store = tmp_path / "history.sqlite3"
    try:
        read_until(controller, proc, "smollm2-135m-instruct · streaming".encode(), 90)  # loaded
        os.write(controller, data[:cut])
        read_until(controller, proc, None, 0.3)  # (most likely read apart: either way the same text)
        os.write(controller, data[cut:])
        # the box draws an ESC as a symbol (a BEL not at all: rich drops it), never raw
        read_until(controller, proc, "third [␛]0;title end".encode(), 30)
        os.write(controller, b"\r")
        deadline = time.monotonic() + 60
        while not stored_user_messages(store) and time.monotonic() < deadline:
            read_until(controller, proc, None, 0.3)
        os.write(controller, b"\x11")  # Ctrl+Q (the box is empty: it quits at once)
        read_until(controller, proc, None, 30)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(controller)
    assert stored_user_messages(store) == [pasted]
