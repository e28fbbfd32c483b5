"""A branch: a reply continued from tokens already chosen (a collaborator of the reply run).

`reply_prefix` follows the prompt (the steps are numbered from its length, max_tokens
counts it); `first_token`, if given, is the run's first step's token instead of a draw
(recorded with chosen_by "hand" and its probability in both distributions). Pure: the
vocabulary size is all it needs of the model.
"""

from __future__ import annotations

from dataclasses import dataclass

from loopchat.errors import EngineError
from loopchat.request import ReplyRequest


@dataclass(frozen=True, slots=True)
class Branch:
    prefix: tuple[int, ...] = ()
    first_token: int | None = None

    @classmethod
    def of(cls, request: ReplyRequest, n_vocab: int) -> Branch:
        """The request's branch; EngineError for a token outside the vocabulary."""
        prefix = tuple(int(t) for t in request.reply_prefix)
        first = None if request.first_token is None else int(request.first_token)
        if any(not 0 <= t < n_vocab for t in prefix) or (first is not None and not 0 <= first < n_vocab):
            raise EngineError("the reply to continue holds a token that is not of this model's vocabulary")
        return cls(prefix, first)

    @property
    def base(self) -> int:
        """The index of the run's first step (the prefix's tokens are steps 0..base-1)."""
        return len(self.prefix)

    def given(self, step: int) -> int | None:
        """The token the run's step `step` (0: its first) takes without a draw, if any."""
        return self.first_token if step == 0 else None
