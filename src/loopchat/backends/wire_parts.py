"""The pieces of an OpenAI-compatible server's JSON that wire_reader.py reads: error
objects, logprobs entries (the chat shape and the legacy completions shape), token
pieces and their bytes, and a chunk's text divided among its tokens. Pure functions; a
malformed piece raises WireError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


class WireError(Exception):
    """What the server sent is not what the protocol says (one-line message)."""


class ServerError(Exception):
    """The server reported an error in the stream (OpenAI's `{"error": {...}}`)."""


def error_message(obj: Any) -> str | None:
    """The message of OpenAI's error shape (or FastAPI's `{"detail": ...}`), if `obj` is one."""
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if isinstance(err, dict):
        msg = err.get("message")
        return str(msg) if msg else str(err.get("type") or "error")
    if isinstance(err, str):
        return err
    detail = obj.get("detail")
    if detail is not None and "choices" not in obj:
        return str(detail)
    return None


def split_text(content: str, pieces: Sequence[str]) -> list[str]:
    """`content` divided among the tokens it is made of, in order, so that the parts
    joined are `content`: a token whose piece follows in the content gets that piece; a
    token that is part of a character (its piece is "" or U+FFFD) gets nothing, and the
    character goes to the token that completes it (the last one before the next piece
    that matches). What cannot be matched goes to the token where matching failed."""
    out = [""] * len(pieces)
    if not pieces:
        return out
    pos = 0
    pending = False  # tokens since the last match that got no text
    for i, piece in enumerate(pieces):
        whole = bool(piece) and "\ufffd" not in piece
        if not whole:
            pending = True
            continue
        if content.startswith(piece, pos):
            out[i] = piece
            pos += len(piece)
            pending = False
            continue
        j = content.find(piece, pos) if pending else -1
        if j > pos:
            out[i - 1] += content[pos:j]
            out[i] = piece
            pos = j + len(piece)
            pending = False
            continue
        out[i] += content[pos:]  # out of step with the content: the rest goes here
        return out
    out[-1] += content[pos:]
    return out


def prob_of(logprob: Any) -> float:
    if not isinstance(logprob, (int, float)) or isinstance(logprob, bool):
        raise WireError(f"a logprob is {type(logprob).__name__}, not a number")
    return math.exp(logprob) if logprob > -1000 else 0.0


def entry_piece(entry: dict[str, Any]) -> tuple[str, bytes | None]:
    token = entry.get("token")
    raw = entry.get("bytes")
    data = None
    if isinstance(raw, list) and all(isinstance(b, int) and 0 <= b < 256 for b in raw):
        data = bytes(raw)
    if not isinstance(token, str):
        if data is None:
            raise WireError("a logprobs entry has no token text")
        token = data.decode("utf-8", errors="replace")
    return token, data


def logprob_entries(logprobs: Any) -> list[dict[str, Any]] | None:
    """The chat shape's per-token entries (None: no logprobs in this chunk)."""
    if logprobs is None:
        return None
    if not isinstance(logprobs, dict):
        raise WireError(f"logprobs is {kind_of(logprobs)}, not an object")
    if "content" in logprobs:
        entries = logprobs.get("content")
        if entries is None:
            return None
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise WireError("logprobs.content is not a list of objects")
        return entries
    if "tokens" in logprobs:  # the legacy shape (/v1/completions)
        tokens = logprobs.get("tokens") or []
        lps = logprobs.get("token_logprobs") or []
        tops = logprobs.get("top_logprobs") or []
        if not (isinstance(tokens, list) and isinstance(lps, list) and isinstance(tops, list)):
            raise WireError("legacy logprobs fields are not lists")
        out = []
        for i, token in enumerate(tokens):
            top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
            out.append(
                {
                    "token": token,
                    "logprob": lps[i] if i < len(lps) else None,
                    "top_logprobs": [{"token": t, "logprob": lp} for t, lp in top.items()],
                }
            )
        return out
    return None


def entry_id(entry: dict[str, Any]) -> int | None:
    """A token id, where the server sends one (llama.cpp's `id`; OpenAI's shape has none)."""
    value = entry.get("id")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def token_count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def kind_of(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )
