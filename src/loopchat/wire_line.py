"""A chat stream's token chunk written straight as its SSE line (`TokenLine`), the same text as
wire.py's `sse_line` of `WireSerializer.feed`'s chunk object, with less work a token.

`loopchat serve` writes one such line per token on the event loop's thread, beside the forward
pass on a 2-core machine: the chunk object (a dict of ~12 more dicts and lists) built, then
walked by the JSON encoder, was most of the event loop's work for a token (docs/performance.md,
"`loopchat serve`'s token on both threads"). Here the parts every chunk of a response shares (its
id, created, model, the keys) are encoded once, each top-list token's `{"token": ..., "bytes":
[...]}` text once per token it is seen as (`_faces`), and a line joins them with the step's
own text and floats. Each piece is what the encoder writes for it: strings by `encode` (the
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
        #: (text, piece bytes) -> ('{"token":<text>,"logprob":', ',"bytes":<bytes>}'): a top entry's fixed parts
        self._faces: dict[tuple[str, bytes | None], tuple[str, str]] = {}

    def _face(self, text: str, piece_bytes: bytes | None) -> tuple[str, str]:
        key = (text, piece_bytes)
        face = self._faces.get(key)
        if face is None:
            raw = list(piece_bytes) if piece_bytes is not None else self._token_bytes(text)
            face = self._faces[key] = ('{"token":' + self._encode(text) + ',"logprob":', ',"bytes":' + _bytes_json(raw))
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
