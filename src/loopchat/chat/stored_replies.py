"""A stored conversation (history/) back into the chat's records, without Textual.

`restore` rebuilds the path the store shows (root -> most recent leaf): a ReplyRecord
per stored reply, with its events as they were recorded (so the transcript, the loop
panel and the token cursor show a stored reply as they showed it live), the turns the
next message is sent with, and the node that message hangs from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loopchat.chat.conversation import STREAM, Conversation, ReplyRecord
from loopchat.chat.history_recorder import made_up_finish
from loopchat.engine.chat_prompt import COMPLETION
from loopchat.events import DOCUMENT, ContextTrimmed, Finish, FinishReason, Message, Prefill, Start, Step
from loopchat.history.replays import node_start, replayed, run_of, shown_path

if TYPE_CHECKING:
    from loopchat.history.store import StoredConversation

#: Finish.error of a stored reply that has no finish event at all
NO_FINISH = "cut short: the store has no end for this reply"


@dataclass
class Restored:
    conversation: Conversation
    shown: list[tuple[str, ReplyRecord | None]] = field(default_factory=list)  # (user text, its reply)
    tip: int | None = None  # the node the next message hangs from
    #: every rebuilt reply -> (its user node, that node's parent, its own node)
    replies: dict[ReplyRecord, tuple[int, int | None, int]] = field(default_factory=dict)


def restore(stored: StoredConversation) -> Restored:
    conv = Conversation(system_prompt=stored.system_prompt)
    out = Restored(conv)
    sys = (Message("system", stored.system_prompt),) if stored.system_prompt else ()
    _walk(stored, shown_path(stored), conv, out, sys, conv.turns, main=True)
    return out


def _walk(
    stored: StoredConversation,
    nodes: list,
    conv: Conversation,
    out: Restored,
    sys: tuple[Message, ...],
    turns: list[Message],
    main: bool,
) -> list[tuple[ReplyRecord, bool, bool]]:
    """The replies of a path of stored nodes, with the other versions of each (hidden).
    `main`: the path shown (its turns are the conversation's); else the later turns of a
    version set aside, rebuilt hidden: returned as that version's `tail` entries (each
    reply with its in_history and in_turns for when the version is shown again)."""
    entries: list[tuple[ReplyRecord, bool, bool]] = []
    user: tuple[int, int | None, Message] | None = None  # (node id, parent id, message)
    for node in nodes:
        if node.role in ("user", DOCUMENT):
            user = (node.id, node.parent_id, Message(node.role, node.content))
            if node.role == DOCUMENT:
                conv.mode = COMPLETION  # its turns are the document's pieces
            if main:
                out.shown.append((node.content, None))
        elif node.role == "assistant":
            asked = user[2] if user is not None else Message("user", "")
            before = list(turns)
            messages = (*sys, *before, asked)
            shown, aside, replays = _versions(stored, node, user, messages, len(before), conv, out)
            rec = shown
            if main:
                if user is not None:
                    out.shown[-1] = (out.shown[-1][0], rec)
                else:
                    out.shown.append(("", rec))
            f = rec.finish
            in_turns = f is not None and f.reason != FinishReason.ERROR and bool(rec.text)
            if in_turns:
                turns.extend([asked, Message("assistant", rec.text)])
                if main:
                    out.tip = node.id
            if main:
                rec.in_turns = in_turns
            else:
                rec.in_history, rec.hidden = False, True
                entries.append((rec, True, in_turns))
            for r in replays:
                r.hidden = not main or r.replay_of != (rec.replay_of or rec.number)
                if not r.hidden:
                    out.shown.append(("", r))
                elif not main:
                    entries.append((r, False, False))
            for version, version_node in aside:  # the later turns built on each version set aside
                _tail_of(stored, version, version_node, conv, out, sys, before, asked)
            user = None
        elif node.role == "system" and conv.system_prompt is None:
            conv.system_prompt = node.content
    return entries


def _versions(
    stored: StoredConversation,
    node: Any,
    user: tuple[int, int | None, Message] | None,
    messages: tuple[Message, ...],
    turn_base: int,
    conv: Conversation,
    out: Restored,
) -> tuple[ReplyRecord, list[tuple[ReplyRecord, object]], list[ReplyRecord]]:
    """The replies of the turn whose shown reply is `node`: (that reply, the other versions
    set aside with their nodes, F9's replays), each made in `conv` in the order made."""
    # the other versions of this turn's reply (F5, branches), hidden, in the order made
    others = [
        n
        for n in stored.nodes
        if n.role == "assistant" and n.parent_id == node.parent_id and n.id != node.id and user is not None
    ]
    versions: list[ReplyRecord] = []
    aside: list[tuple[ReplyRecord, object]] = []
    shown = None
    replays: list[ReplyRecord] = []
    for other in sorted([*others, node], key=lambda n: n.id):
        of = _replayed(other, [*versions, *replays])
        rec = conv.new_reply(
            other.mode or STREAM,
            messages,
            turn_base=turn_base,
            **({"replay_of": of.replay_of or of.number, "in_history": False} if of else {"siblings": versions}),
        )
        _fill(rec, other.events, other.content)
        if user is not None:
            out.replies[rec] = (user[0], user[1], other.id)
        if of is not None:  # F9's, shown after the turn's reply (if that is the one shown)
            replays.append(rec)
        elif other is not node:
            rec.in_history, rec.hidden = False, True
            aside.append((rec, other))
        else:
            shown = rec
    _where_branched(versions)
    assert shown is not None  # (node is one of them)
    return shown, aside, replays


def _tail_of(
    stored: StoredConversation,
    version: ReplyRecord,
    node: object,
    conv: Conversation,
    out: Restored,
    sys: tuple[Message, ...],
    before: list[Message],
    asked: Message,
) -> None:
    """A version set aside gets back the later turns built on it (its subtree's most
    recent path), hidden, for when it is shown again."""
    f = version.finish
    if f is None or f.reason == FinishReason.ERROR or not version.text:
        return
    leaf = stored.latest_leaf(under=node.id)  # type: ignore[attr-defined]
    if leaf is None:
        return
    path = stored.path(leaf)
    ids = [n.id for n in path]
    turns = [*before, asked, Message("assistant", version.text)]
    version.tail = _walk(stored, path[ids.index(node.id) + 1 :], conv, out, sys, turns, main=False)  # type: ignore[attr-defined]
    version.tail_turns = turns[len(before) + 2 :]


def _replayed(reply: object, earlier: list) -> Any:
    """The earlier reply (a record of `earlier`) that the stored node `reply` replays (F9), or None."""
    return replayed(reply.mode, run_of(node_start(reply)), earlier, start_of=lambda r: r.start)  # type: ignore[attr-defined]


def _where_branched(versions: list[ReplyRecord]) -> None:
    """A stored branch knows its prefix (Start.reply_prefix): it branched at its end,
    from the first earlier version whose tokens begin with it."""
    for i, rec in enumerate(versions):
        prefix = list(rec.start.reply_prefix) if rec.start is not None else []
        if not prefix:
            continue
        rec.branch_at = len(prefix)
        rec.branch_from = next(
            (o.number for o in versions[:i] if [s.token_id for s in o.steps[: len(prefix)]] == prefix), None
        )


def _fill(rec: ReplyRecord, events: list, text: str) -> None:
    for ev in events:
        match ev:
            case Start():
                rec.start = ev
                rec.messages = ev.messages  # exactly what was sent
            case ContextTrimmed():
                rec.trimmed = ev
            case Prefill():
                rec.prefill = ev
            case Step():
                rec.steps.append(ev)
            case Finish():
                rec.finish = ev
    if rec.finish is None:
        if rec.start is not None:
            rec.finish = made_up_finish(rec, FinishReason.ERROR, NO_FINISH)
        else:
            rec.error = NO_FINISH
