"""A chat stream's token chunk written straight as its SSE line (`TokenLine`), the same text as
wire.py's `sse_line` of `WireSerializer.feed`'s chunk object, with less work a token.

`loopchat serve` writes one such line per token on the event loop's thread, beside the forward
pass on a 2-core machine: the chunk object (a dict of ~12 more dicts and lists) built, then
walked by the JSON encoder, was most of the event loop's work for a token (docs/performance.md,
"`loopchat serve`'s token on both threads"). Here the parts every chunk of a response shares (its
id, created, model, the keys) are encoded once, each top-list token's `{"token": ..., "bytes":
[...]}` text once per token it is seen as (`_faces`, kept from reply to reply), and a line joins
them with the step's own text and floats. Each piece is what the encoder writes for it: strings by `encode` (the
encoder's own string escaping, ensure_ascii off), floats by float.__repr__ (NaN, Infinity as the
encoder writes them), ints by int.__repr__, and the compact separators; tests/test_wire_line.py
compares the two writers' lines over recorded and made-up steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from loopchat.events import Candidate, Step


def _float(x: float) -> str:
    """json's float text (allow_nan: NaN, Infinity, -Infinity)."""
    if x != x:
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return float.__repr__(x)


def _bytes_json(raw: list[int] | None) -> str:
    return "null" if raw is None else "[" + ",".join(map(str, raw)) + "]"


#: The faces' tables, one per (encode, token_bytes) pair of writers (one in practice: wire.py's), kept
#: from reply to reply: a face depends on its token's text and bytes only, and a served reply of 128
#: tokens with the top 5 met ~6 faces a token, most of them new to a table of its own (writing them
#: was a third of the line's time: docs/performance.md, "The event loop's work per chunk"). A table
#: holds at most a vocabulary's faces (~300 bytes each); cleared past FACES_MAX, ~5 MB (the tokens
#: met most stay few: a server's memory after a soak of requests must stay within 10% of its first's).
_SHARED: dict[tuple[Callable[..., Any], Callable[..., Any]], dict[tuple[str, bytes | None], tuple[str, str]]] = {}
FACES_MAX = 1 << 14


class TokenLine:
    """The SSE lines of one chat stream's token chunks (a Step that is not a stop token, no
    extension items pending): `line(step)`. `encode` is wire.py's compact, ensure_ascii-off
    encoder; `token_bytes` and `logprob` are wire.py's own."""

    def __init__(
        self,
        encode: Callable[[Any], str],
        head: dict[str, Any],
        top_logprobs: int,
        logprobs: bool,
        usage: bool,
        token_bytes: Callable[[str], list[int] | None],
        logprob: Callable[[float | None], float],
    ) -> None:
        self._encode, self._n, self._logprobs = encode, top_logprobs, logprobs
        self._token_bytes, self._logprob = token_bytes, logprob
        # {"id":...,"object":...,"created":...,"model":...,"system_fingerprint":null,"choices":[{"index":0,"delta":{"content":
        fields = ",".join(encode(k) + ":" + encode(v) for k, v in head.items())
        self._head = "data: {" + fields + ',"system_fingerprint":null,"choices":[{"index":0,"delta":{"content":'
        self._tail = '"finish_reason":null}]' + (',"usage":null' if usage else "") + "}\n\n"
        #: (text, piece bytes) -> ('{"token":<text>,"logprob":', ',"bytes":<bytes>}'): a top entry's fixed parts,
        #: shared by every line of these writers (a reply's own table was mostly new faces: `_SHARED`)
        faces = _SHARED.get((encode, token_bytes))
        if faces is None:
            faces = _SHARED[(encode, token_bytes)] = {}
        self._faces: dict[tuple[str, bytes | None], tuple[str, str]] = faces

    def _face(self, text: str, piece_bytes: bytes | None) -> tuple[str, str]:
        key = (text, piece_bytes)
        faces = self._faces
        face = faces.get(key)
        if face is None:
            if len(faces) >= FACES_MAX:
                faces.clear()
            raw = list(piece_bytes) if piece_bytes is not None else self._token_bytes(text)
            face = faces[key] = ('{"token":' + self._encode(text) + ',"logprob":', ',"bytes":' + _bytes_json(raw))
        return face

    def line(self, step: Step) -> str:
        """`sse_line(WireSerializer.feed(step)[0])` for this response's options."""
        out = self._head + self._encode(step.text) + '},"logprobs":'
        if not self._logprobs:
            return out + "null," + self._tail
        lp = self._logprob
        head, raw = self._face(step.piece, step.piece_bytes)
        tops = []
        face = self._face
        c: Candidate
        for c in step.raw_top[: self._n]:
            h, b = face(c.text, c.piece_bytes)
            tops.append(h + _float(lp(c.prob)) + b + "}")
        entry = head + _float(lp(step.raw_prob)) + raw + ',"top_logprobs":[' + ",".join(tops) + "]}"
        return out + '{"content":[' + entry + '],"refusal":null},' + self._tail


__all__ = ["TokenLine"]
