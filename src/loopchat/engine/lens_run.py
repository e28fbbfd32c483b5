"""The logit lens in a reply's run (ReplyRequest.lens): the collaborator the run's record
phase asks for the lens of each pass (engine/lens.py computes it; _lens_ffi.py captures
the layers' outputs in a context of its own, which follows the run's tokens).

`NoLens` when the lens is off, or the model has none (its one-line note then goes in the
Start); a `PassLens` re-reads the pass behind each step: the lens's context evaluates the
tokens the run's context holds (only those it does not hold yet), its graph callback
taking each layer's output at the last position. It costs about one more forward pass
and the head's matmul per layer for each step (docs/performance.md).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

from loopchat.events import LensRow


class NoLens:
    def start(self, tokens: Sequence[int], n_prompt: int = 0) -> None:
        pass

    def rows(self, drawn: int) -> tuple[LensRow, ...] | None:
        return None

    def fed(self, token: int) -> None:
        pass


class PassLens(NoLens):
    """The lens of one model (its head and the lens's context), for the run in progress."""

    def __init__(self, head: Any, context: Any, piece: Callable[[int], str]) -> None:
        self.head, self.context, self.piece = head, context, piece
        self.tokens: list[int] = []
        self.n_prompt = 0

    def start(self, tokens: Sequence[int], n_prompt: int = 0) -> None:
        """A run over `tokens` (its prompt's `n_prompt` first, then a branch's prefix)."""
        self.tokens, self.n_prompt = list(tokens), n_prompt

    def rows(self, drawn: int) -> tuple[LensRow, ...] | None:
        """The lens of the pass over the tokens so far, `drawn` the token drawn from it."""
        from loopchat.engine.lens import lens_rows

        hidden, _ = self.context.capture(self.tokens, self.n_prompt)
        if len(hidden) != self.head.n_layer or self.context.problem:
            return None
        return lens_rows(self.head, hidden, drawn, self.piece)

    def fed(self, token: int) -> None:
        self.tokens.append(token)

    def close(self) -> None:
        self.context.close()


def open_lens(llm: Any, path: Any, n_ctx: int, threads: int, piece: Callable[[int], str]) -> PassLens | str:
    """The lens of the model in `path` (loaded as `llm`), or the one line saying why there is none."""
    from loopchat.engine._lens_ffi import LensContext
    from loopchat.engine.lens import LensHead

    try:
        head = LensHead(path)
    except (OSError, ValueError, KeyError, struct.error) as exc:
        return f"no lens for this model: its file could not be read for the head ({exc})"
    if head.problem:
        return head.problem
    return PassLens(head, LensContext(llm, n_ctx, head.n_embd, threads), piece)
