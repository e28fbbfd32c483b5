"""What the history tests share: real replies from the engine, writing one to a store as
the chat does (Start, then batches of events, then Finish), and small real filesystems
(a tmpfs mount: read-only, or full) for the failures a temp folder cannot show."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from loopchat.engine.engine import Engine
from loopchat.event_json import to_json_dict
from loopchat.events import Event, Finish, Message, Start
from loopchat.history.store import ConversationStore
from loopchat.settings import SamplingSettings

SYSTEM = Message("system", "You are a helpful assistant.")


def generate(engine: Engine, messages: Sequence[Message], settings, **kw) -> list[Event]:
    engine.reset()
    events = list(engine.generate(list(messages), settings, **kw))
    assert isinstance(events[0], Start) and isinstance(events[-1], Finish)
    return events


def short_reply(engine: Engine, text: str, seed: int, *history: Message, max_tokens: int = 12) -> list[Event]:
    return generate(
        engine, [SYSTEM, *history, Message("user", text)], SamplingSettings(seed=seed, max_tokens=max_tokens)
    )


def store_reply(
    store: ConversationStore,
    conv: int,
    parent: int | None,
    events: Sequence[Event],
    mode: str = "stream",
    batch: int = 5,
) -> int:
    """Write a reply as the chat does: its row at Start, its events in batches, its Finish."""
    node = store.begin_reply(conv, parent, mode, events[0])
    body = list(events[1:-1])
    for i in range(0, len(body), batch):
        store.add_events(node, body[i : i + batch])
    store.finish_reply(node, events[-1])
    return node


def as_json(events: Sequence[Event]) -> list[dict]:
    return [to_json_dict(e) for e in events]


@contextmanager
def tmpfs(path: Path, size: str = "4m") -> Iterator[Path]:
    """A real small filesystem at `path` (mounting needs root: the tests run as root here)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextmanager
def folder_to_lock(path: Path) -> Iterator[Path]:
    """A folder that `make_readonly` can make read-only for this process: as root (who
    ignores permission bits) its own tmpfs, remounted read-only; otherwise a plain folder."""
    if os.geteuid() == 0:
        with tmpfs(path) as p:
            yield p
        return
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    finally:
        path.chmod(0o755)
        for p in path.iterdir():
            p.chmod(0o644)


def make_readonly(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
    else:
        for p in path.iterdir():
            p.chmod(0o444)
        path.chmod(0o555)
