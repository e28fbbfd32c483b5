"""F9 replays a reply: the same messages, settings and seed (a server is sent the seed the
client drew for the reply when none was pinned). A local model then draws the same
tokens; llama.cpp's llama-server reproduces a reply under a seed too, but a server may
not (one that ignores `seed`, or OpenAI's best effort). So a finished replay's tokens are
compared with its original's, and a difference is said: once as a notice, at the end of
the replay's info line, and in Compare's "replay" row.

Tokens are compared by (token id, piece) in order, stop tokens left out, and so is the last
step of a remote server's reply that ended by itself where that step adds no text: its end token
(llama-server sends its chunk, with its logprobs, in one reply and not in another of the same
tokens, and a remote step does not know it is a stop token). A replay or an original that was
stopped or failed is not compared (it ended for another reason).
"""

from __future__ import annotations

from loopchat.chat.conversation import Conversation, ReplyRecord
from loopchat.events import FinishReason

#: the finishes a replay can be compared on: the reply ended by itself
_WHOLE = (FinishReason.STOP, FinishReason.LENGTH, FinishReason.CONTEXT)


def tokens(rec: ReplyRecord) -> list[tuple[int | None, str]]:
    steps = [s for s in rec.steps if not s.is_stop]
    remote = rec.start is not None and bool(rec.start.source)
    if remote and steps and steps[-1].text == "" and rec.finish is not None and rec.finish.reason == FinishReason.STOP:
        steps.pop()  # (a remote server's end token, sent or not)
    return [(s.token_id, s.piece) for s in steps]


def replay_verdict(replay: ReplyRecord, original: ReplyRecord) -> str | None:
    """What the replay's tokens say against the original's: "same tokens", "differs: ...",
    or None when they cannot be compared (not a replay of it, or either did not end whole)."""
    if replay.replay_of != original.number or replay is original:
        return None
    if not all(r.finish is not None and r.finish.reason in _WHOLE for r in (replay, original)):
        return None
    a, b = tokens(original), tokens(replay)
    if a == b:
        return f"same tokens as reply {original.number} ({len(a)})"
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    who = (
        "this server did not reproduce the seed"
        if replay.start and replay.start.source
        else "the same seed drew other tokens"
    )
    return f"differs from reply {original.number} from token {first + 1}: {who}"


def check_replay(rec: ReplyRecord, conversation: Conversation) -> str | None:
    """A replay that just finished: its tokens against its original's. A difference is
    added to its info line (its note) and returned, to be said once; else None."""
    original = conversation.reply(rec.replay_of) if rec.replay_of is not None else None
    verdict = replay_verdict(rec, original) if original is not None else None
    if verdict is None or not verdict.startswith("differs") or verdict in (rec.note or ""):
        return None  # (the same, or said already)
    rec.note = f"{rec.note} · {verdict}" if rec.note else verdict
    return f"Reply {rec.number}, the replay of reply {original.number}: {verdict}"  # type: ignore[union-attr]


def replay_rows(a: ReplyRecord, b: ReplyRecord) -> list[tuple[str, str, str, str]]:
    """Compare's row when one side replays the other (F9): same tokens, or where they differ."""
    verdict = replay_verdict(b, a) or replay_verdict(a, b)
    if verdict is None:
        return []
    if b.replay_of == a.number:
        return [("replay", "", f"B: {verdict}", "")]
    return [("replay", f"A: {verdict}", "", "")]
