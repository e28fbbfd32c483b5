"""Tokens on watch (issue 24, item 4): the user's own tokens, followed at every pass.

Up to MAX_WATCH strings (the chat's palette entry, `loopchat run --watch`, the request's
`watch`); the engine watches the first token of each as the model's tokenizer splits it
(no BOS, special tokens not parsed), named in the Start (`Start.watch`: the string and
its token id). Every Step then carries, for each watched token, a `WatchedToken`: its
probability and rank in the raw softmax and in the distribution sampled from, even far
outside the reported top-K (docs/trace-format.md, "Tokens on watch").
"""

from __future__ import annotations

import shlex
from typing import NamedTuple

MAX_WATCH = 8


class WatchedToken(NamedTuple):
    """One watched token at one step."""

    token_id: int
    raw_prob: float  # in the raw softmax over the whole vocabulary
    raw_rank: int  # 1 + the tokens with a larger raw logit
    sampled_prob: float  # in the distribution sampled from (0: the settings cut it)
    sampled_rank: int  # 1 + the kept tokens more likely than it (0: cut)


class WatchError(ValueError):
    """A watch list that cannot be used: the message is one line saying what to do."""


def check_watch(texts: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The watch list as given, checked (WatchError: too many, or an empty string)."""
    if len(texts) > MAX_WATCH:
        raise WatchError(f"at most {MAX_WATCH} tokens on watch (got {len(texts)}): drop some")
    if any(t == "" for t in texts):
        raise WatchError('a token on watch cannot be empty: write its text, e.g. " Paris" (a space first)')
    return tuple(texts)


def parse_watch(line: str) -> tuple[str, ...]:
    """The chat's one-line form: strings separated by spaces, quoted where they hold a
    space (shell quoting: `" Paris" " London" Berlin`). Empty: nothing on watch."""
    try:
        texts = shlex.split(line)
    except ValueError as exc:
        raise WatchError(f'tokens on watch: {exc} (quote each, e.g. " Paris" " London")') from None
    return check_watch(texts)


def watch_line(texts: tuple[str, ...]) -> str:
    """The one-line form of a watch list (parse_watch's inverse)."""
    return " ".join(shlex.quote(t) if t.strip() == t and t else '"' + t.replace('"', '\\"') + '"' for t in texts)


def watched_line(watched: tuple[WatchedToken, ...], names: tuple[tuple[str, int], ...]) -> str:
    """One step's watched tokens as text (`loopchat run --show-steps`): for each, its raw
    probability and rank, then the sampled ones ("cut": the settings removed it)."""
    parts = []
    for (text, _), w in zip(names, watched):
        sampled = f"{w.sampled_prob:.3g} #{w.sampled_rank}" if w.sampled_rank else "cut"
        parts.append(f"{text!r} {w.raw_prob:.3g} #{w.raw_rank} → {sampled}")
    return "  watch " + " · ".join(parts)
