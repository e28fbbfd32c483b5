"""A stored conversation written out, and a trace read in.

- Markdown: the conversation as text (one path of its tree), each reply with an info line
  like the chat's (delivery, TTFT, total, tokens, tok/s, how it ended);
- a trace (docs/trace-format.md) of the replies on that path, which `loopchat replay`
  plays; a cut reply is written without a Finish, as a trace cut short is;
- JSON of the whole tree: every node with its reply's events.

Each file is written atomically: a temporary file in the same folder, flushed and
fsynced, then renamed over the target (a reader never sees half a file; a failed export
leaves the old one). `import_trace` turns a trace into a new conversation.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loopchat.event_json import to_json_dict
from loopchat.events import SCHEMA_VERSION as TRACE_SCHEMA_VERSION
from loopchat.events import Event, Finish, FinishReason, Prefill, Start, Step
from loopchat.history.replays import shown_path
from loopchat.history.store import ConversationStore, StoredConversation, StoredNode, StoreError
from loopchat.trace import TraceError, read_trace
from loopchat.version import __version__

#: The JSON export's own format version (bumped when a field is removed or changes meaning).
JSON_FORMAT_VERSION = 1


def write_atomically(path: str | Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder (flush, fsync,
    rename); StoreError (one line) if it cannot be written."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        try:  # the rename itself, on disk
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError:
            pass
    except OSError as exc:
        raise StoreError(f"cannot write {path} ({exc.strerror or exc})") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


# ---- Markdown ------------------------------------------------------------------------------------
def _fmt_ms(ms: float) -> str:
    from loopchat.chat.plots import fmt_ms  # a plain function (no Textual): the chat's own formatting

    return fmt_ms(ms)


def info_line(node: StoredNode) -> str:
    """A reply's info line, as the chat shows it under the reply."""
    from loopchat.chat.conversation import finish_label
    from loopchat.chat.plots import fmt_rate, fmt_tokens

    finish = next((e for e in reversed(node.events) if isinstance(e, Finish)), None)
    if finish is None:
        return "still being written"
    start = node.events[0] if node.events and isinstance(node.events[0], Start) else None
    server = start.source if start is not None else ""
    parts = ["blocking" if node.mode == "blocking" else "streamed"]
    if server:
        parts[0] += " from " + server
    if node.mode == "blocking":
        first = _fmt_ms(finish.ttft_ms) if finish.ttft_ms is not None else "not given"
        parts.append(f"whole reply shown after {_fmt_ms(finish.total_ms)} (model's first token at {first})")
    else:
        if finish.completion_tokens or (finish.completion_tokens is None and finish.steps):
            parts.append(f"TTFT {_fmt_ms(finish.ttft_ms)}" if finish.ttft_ms is not None else "TTFT not given")
        parts.append(f"total {_fmt_ms(finish.total_ms)}")
    parts.append(fmt_tokens(finish.completion_tokens) if finish.completion_tokens is not None else "tokens not given")
    if finish.tokens_per_s:
        parts.append(fmt_rate(finish.tokens_per_s))
    label = finish_label(finish)
    if node.status == "cut":
        label = "cut short (loopchat stopped during this reply)"
    elif finish.reason in (FinishReason.CANCELLED, FinishReason.ERROR):
        label = f"{label} ({finish.reason.value})" + (f": {finish.error}" if finish.error else "")
    parts.append(label)
    return " · ".join(parts)


_HEADINGS = {"user": "User", "assistant": "Assistant", "system": "System", "document": "Document"}


def to_markdown(conv: StoredConversation, leaf_id: int | None = None) -> str:
    s = conv.summary
    lines = [f"# {s.title}", ""]
    model = s.model_name + (f" ({conv.model_path})" if conv.model_path and conv.model_path != s.model_name else "")
    lines += [f"*{model} · {time.strftime('%Y-%m-%d %H:%M', time.localtime(s.created))}*", ""]
    path = shown_path(conv, leaf_id)
    if conv.system_prompt and not any(n.role == "system" for n in path):
        lines += ["## System", "", conv.system_prompt, ""]
    reply = 0
    for node in path:
        heading = _HEADINGS.get(node.role, node.role.title())
        if node.role == "assistant":
            reply += 1
            heading += f" · reply {reply}"
        lines += [f"## {heading}", "", node.content, ""]
        if node.role == "assistant":
            lines += [f"*{info_line(node)}*", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def export_markdown(conv: StoredConversation, path: str | Path, leaf_id: int | None = None) -> None:
    """The conversation's path (default: to its most recent leaf), each reply with its info line."""
    write_atomically(path, to_markdown(conv, leaf_id))


# ---- trace ------------------------------------------------------------------------------------------
def _trace_lines(events: Sequence[Event], base_ms: float, cut: bool) -> tuple[list[dict[str, Any]], float]:
    """One reply's lines with t_ms made from its own clock readings (the store keeps no
    wall times per event); a cut reply without its made-up Finish."""
    out = []
    end = base_ms
    for ev in events:
        if isinstance(ev, Finish):
            if cut:
                break
            t = base_ms + ev.total_ms
        elif isinstance(ev, Prefill):
            t = base_ms + ev.ms
        elif isinstance(ev, Step):
            t = base_ms + ev.elapsed_ms
        else:
            t = base_ms
        end = max(end, t)
        obj = to_json_dict(ev)
        obj["t_ms"] = round(t, 3)
        out.append(obj)
    return out, end


def to_trace(conv: StoredConversation, leaf_id: int | None = None) -> str:
    header = {
        "kind": "header",
        "schema_version": TRACE_SCHEMA_VERSION,
        "loopchat_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "conversation": conv.summary.title,
    }
    lines = [json.dumps(header, ensure_ascii=False)]
    t = 0.0
    for node in shown_path(conv, leaf_id):
        if node.role != "assistant" or not node.events:
            continue
        objs, end = _trace_lines(node.events, t, cut=node.status != "complete")
        lines += [json.dumps(o, ensure_ascii=False) for o in objs]
        t = end + 500.0  # a pause between replies when played at the recorded pace
    return "\n".join(lines) + "\n"


def export_trace(conv: StoredConversation, path: str | Path, leaf_id: int | None = None) -> None:
    """The replies on the path as a trace (docs/trace-format.md): `loopchat replay` plays it."""
    write_atomically(path, to_trace(conv, leaf_id))


# ---- JSON ---------------------------------------------------------------------------------------------
def to_json(conv: StoredConversation) -> dict[str, Any]:
    s = conv.summary
    return {
        "format": "loopchat-conversation",
        "format_version": JSON_FORMAT_VERSION,
        "trace_schema_version": TRACE_SCHEMA_VERSION,  # the events are the trace's
        "id": s.id,
        "title": s.title,
        "model_name": s.model_name,
        "model_path": conv.model_path,
        "model_size": conv.model_size,
        "system_prompt": conv.system_prompt,
        "created": s.created,
        "updated": s.updated,
        "nodes": [
            {
                "id": n.id,
                "parent_id": n.parent_id,
                "role": n.role,
                "content": n.content,
                "created": n.created,
                "mode": n.mode,
                "status": n.status,
                "events": [to_json_dict(e) for e in n.events],
            }
            for n in conv.nodes
        ],
    }


def export_json(conv: StoredConversation, path: str | Path) -> None:
    """The whole tree: every message, every reply with its events (parents before children)."""
    write_atomically(path, json.dumps(to_json(conv), ensure_ascii=False, indent=1) + "\n")


# ---- import --------------------------------------------------------------------------------------------
def _title(text: str, limit: int = 60) -> str:
    words = " ".join(text.split())
    return words if len(words) <= limit else words[: limit - 1].rstrip() + "…"


def import_trace(store: ConversationStore, path: str | Path, title: str | None = None) -> int:
    """A trace file -> a new conversation: one user (or document) message and its reply per
    traced reply, each under the one before (the user's message is the last of the reply's
    Start.messages; the system prompt is the first reply's). A reply the trace holds without
    its Finish (cut short) is stored as cut. Returns the conversation's id; TraceError
    (one line) for a file that is not a trace."""
    path = Path(path)
    _, traced = read_trace(path)
    replies: list[list[tuple[Event, bool]]] = []
    for t in traced:
        if isinstance(t.event, Start):
            replies.append([])
        if replies:
            replies[-1].append((t.event, t.synthetic))
    if not replies:
        raise TraceError(f"{path} holds no reply to import")
    first = replies[0][0][0]
    assert isinstance(first, Start)
    system = next((m.content for m in first.messages if m.role == "system"), None)
    asked = next((m.content for m in reversed(first.messages) if m.role in ("user", "document")), "")
    conv = store.new_conversation(
        title or _title(asked) or path.stem,
        first.model_name,
        first.model_path or "",
        first.model_size_bytes or 0,
        system,
    )
    parent: int | None = None
    for reply in replies:
        start = reply[0][0]
        assert isinstance(start, Start)
        last = start.messages[-1] if start.messages else None
        if last is not None and last.role in ("user", "document"):
            parent = store.add_message(conv, parent, last.role, last.content)
        node = store.begin_reply(conv, parent, "stream", start)
        body = [e for e, synthetic in reply[1:] if not synthetic]
        if body and isinstance(body[-1], Finish):
            store.add_events(node, body)  # the Finish in the same transaction
        else:
            store.add_events(node, body)
            store.mark_cut(node)
        parent = node
    return conv
