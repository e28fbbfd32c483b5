"""SIGKILL of the real app (`python -m loopchat` in a pseudo-terminal) mid-reply: the store
opens again, the conversation is there, the reply cut short is marked cut with the steps
written before the kill, and the chat shows it as cut."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_tui_terminal import read_until
from tui_fixtures import FakeBackend, wait_for

from loopchat.chat.prefs import Prefs
from loopchat.events import FinishReason, Step
from loopchat.history.store import CUT, ConversationStore
from loopchat.tui.app import LoopChatApp

pytestmark = [pytest.mark.model, pytest.mark.server]

PROMPT = b"Tell me a very long story about a dragon and a knight."


def stored_steps(path: Path) -> int:
    """Steps written so far of the conversation's reply (0: none yet)."""
    if not path.exists():
        return 0
    with ConversationStore.open(path) as store:
        summaries = store.list_conversations()
        if not summaries:
            return 0
        conv = store.load(summaries[0].id)
    return sum(isinstance(e, Step) for n in conv.nodes for e in n.events)


async def test_sigkill_mid_reply_then_reopen(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = data / "history.sqlite3"
    controller, terminal = pty.openpty()
    env = {
        **os.environ,
        "TERM": "xterm-256color",
        "COLUMNS": "120",
        "LINES": "40",
        "LOOPCHAT_DATA_DIR": str(data),
        "LOOPCHAT_CONFIG_DIR": str(tmp_path / "config"),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopchat", "--threads", "1"],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=env,
        start_new_session=True,
    )
    os.close(terminal)
    try:
        read_until(controller, proc, b"Enter sends", 90)  # the model is loaded: the box takes messages
        os.write(controller, PROMPT + b"\r")
        deadline = time.monotonic() + 90
        while stored_steps(store) < 8:  # steps of the reply in flight are in the file
            assert proc.poll() is None, "the app exited"
            assert time.monotonic() < deadline, "no steps written within 90 s"
            read_until(controller, proc, None, 0.2)  # keep the terminal drained
        proc.kill()  # SIGKILL: no handler runs, nothing is flushed
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(controller)

    with ConversationStore.open(store) as s:  # opens: not corrupt; the dead writer's reply is cut
        (summary,) = s.list_conversations()
        assert summary.title == PROMPT.decode() and summary.replies == 1 and summary.cut == 1
        conv = s.load(summary.id)
    user, reply = conv.nodes
    assert user.content == PROMPT.decode() and reply.parent_id == user.id
    assert reply.status == "cut"
    steps = [e for e in reply.events if isinstance(e, Step)]
    assert len(steps) >= 8 and [st.index for st in steps] == list(range(len(steps)))
    finish = reply.events[-1]
    assert finish.reason == FinishReason.ERROR and finish.error == CUT
    assert finish.text == reply.content == "".join(st.text for st in steps)

    # the next start: the list shows it cut; opened, the reply is marked cut, its steps clickable
    app = LoopChatApp(FakeBackend(), prefs=Prefs(markdown=False), prefs_path=tmp_path / "p.json", history_path=store)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: len(app.screen.query("#history-list")) == 1, 5, "the list")
        assert "1 cut" in str(app.screen.options.get_option_at_index(0).prompt)
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.replies) == 1, 5, "the conversation")
        (view,) = app.transcript.reply_views()
        assert "cut short" in str(view.info_text())
        assert view.body_text() == reply.content
        assert app.conversation.turns == []  # a cut reply is not part of what the next message sends
        await pilot.press("alt+left")
        assert app.selection is not None and app.selection[0] == 1
