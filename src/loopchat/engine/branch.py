"""A branch: a reply continued from tokens already chosen (a collaborator of the reply run).

`reply_prefix` follows the prompt (the steps are numbered from its length, max_tokens
counts it); `first_token`, if given, is the run's first step's token instead of a draw,
and `forced` the tokens of the steps after it (or from the first, without one): each
recorded with chosen_by "hand" and its probability in both distributions. A run with
`forced` tokens ends with the last of them (a live max_tokens change does not move it). Pure: the
vocabulary size is all it needs of the model.
"""

from __future__ import annotations

from dataclasses import dataclass

from loopchat.errors import EngineError
from loopchat.request import ReplyRequest


@dataclass(frozen=True, slots=True)
class Branch:
    prefix: tuple[int, ...] = ()
    given_tokens: tuple[int, ...] = ()  # the run's first steps' tokens, given, not drawn
    forced: bool = False  # the run ends with its given tokens (request.forced), whatever max_tokens says

    @classmethod
    def of(cls, request: ReplyRequest, n_vocab: int) -> Branch:
        """The request's branch; EngineError for a token outside the vocabulary."""
        prefix = tuple(int(t) for t in request.reply_prefix)
        first = () if request.first_token is None else (int(request.first_token),)
        given = first + tuple(int(t) for t in request.forced)
        if any(not 0 <= t < n_vocab for t in prefix + given):
            raise EngineError("the reply to continue holds a token that is not of this model's vocabulary")
        return cls(prefix, given, bool(request.forced))

    @property
    def base(self) -> int:
        """The index of the run's first step (the prefix's tokens are steps 0..base-1)."""
        return len(self.prefix)

    def ends(self, taken: int, max_tokens: int) -> bool:
        """The run has reached its length after `taken` tokens of its own: max_tokens (the
        prefix counts), or for a forced run its last given token."""
        if self.forced:
            return taken >= len(self.given_tokens)
        return self.base + taken >= max_tokens

    def given(self, step: int) -> int | None:
        """The token the run's step `step` (0: its first) takes without a draw, if any."""
        return self.given_tokens[step] if step < len(self.given_tokens) else None
