"""F9's replays in a stored conversation. A replay (the last reply again in the other
mode: the same messages, settings, seed and branch prefix) is stored beside the reply it
replays, as a sibling; it is never the conversation's line, though, being the newest
node, it can be the store's most recent leaf."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loopchat.events import Start


def run_of(start: Start | None) -> tuple | None:
    """What a replay repeats of a reply's Start: its messages, settings (the seed too)
    and branch prefix; None without a Start."""
    return None if start is None else (start.messages, start.settings, start.reply_prefix)


def node_start(node: Any) -> Start | None:
    return next((e for e in node.events if isinstance(e, Start)), None)


def replayed(mode: str, run: tuple | None, earlier: Sequence[Any], start_of: Any = node_start) -> Any:
    """Which of `earlier` (stored nodes, or anything `start_of` reads a Start from) a
    reply of `mode` and `run` replays in the other mode, or None. F5 and a branch draw a
    new seed or another token, so none of theirs is taken for a replay."""
    if run is None:
        return None
    return next((e for e in earlier if e.mode != mode and run_of(start_of(e)) == run), None)


def shown_path(stored: Any, leaf_id: int | None = None) -> list:
    """The path to `leaf_id` (default: the most recent leaf), but a replay that ends it
    gives way to the reply it replays: the conversation's line."""
    path = stored.path(leaf_id)
    while path and path[-1].role == "assistant":
        last = path[-1]
        earlier = [
            n for n in stored.nodes if n.role == "assistant" and n.parent_id == last.parent_id and n.id < last.id
        ]
        of = replayed(last.mode, run_of(node_start(last)), earlier)
        if of is None:
            break
        path[-1] = of
    return path
