"""DRY ("Don't Repeat Yourself"): llama.cpp's `llama_sampler_dry_apply`, in numpy.

A token that would extend a sequence the context already holds has its logit lowered by
`multiplier * base ** (length - allowed_length)`, where `length` is the longest such
sequence it would extend (the tokens just before the end of the context that also occur,
in the same order, right before an earlier occurrence of that token), counted only back to
the last sequence breaker, and only if `length >= allowed_length`. docs/trace-format.md
("DRY") gives the computation step by step; `penalties` is it.

The sequence breakers are llama.cpp's defaults, "\\n", ":", "\\"" and "*": a token whose text
holds one of them is a breaker (for one-character breakers llama.cpp's
`get_overlapping_token_sequences` reduces to that: every such token is a whole breaker, with
no tail). A repeated sequence never reaches back past the last breaker in the context, and a
breaker token itself is never penalized. Other breakers are not supported.
"""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Iterable, Sequence
from typing import Any
from weakref import WeakKeyDictionary

import numpy as np

from loopchat.engine import sampler_fused
from loopchat.engine.sampler_scratch import scratch

#: llama.cpp's default `dry_sequence_breakers`
BREAKERS: tuple[bytes, ...] = (b"\n", b":", b'"', b"*")
#: llama.cpp's FLOAT_MAX_LOG: the exponent is clamped to FLOAT_MAX_LOG / ln(base)
FLOAT_MAX_LOG = float(np.float32(88.7228391))

_EMPTY = (np.empty(0, dtype=np.intp), np.empty(0, dtype=np.float32))


def breaker_ids(pieces: Iterable[bytes], breakers: Sequence[bytes] = BREAKERS) -> frozenset[int]:
    """The ids of the tokens whose text (`pieces`, by id) holds one of the breakers."""
    return frozenset(i for i, p in enumerate(pieces) if any(b in p for b in breakers))


_MODEL_BREAKERS: WeakKeyDictionary[Any, frozenset[int]] = WeakKeyDictionary()
#: stand-ins: an object that reaches a model through another (a sequence of a batch, its engine)
_STANDS_FOR: WeakKeyDictionary[Any, Any] = WeakKeyDictionary()


def stands_for(stand_in: Any, model: Any) -> None:
    """`stand_in`'s breakers are `model`'s: found once per model, not once per stand-in (a
    sequence of a batch, a new object per request, would scan the vocabulary on its first draw)."""
    _STANDS_FOR[stand_in] = model


def model_breakers(model: Any) -> frozenset[int]:
    """The breaker ids of a model (`n_vocab`, `piece(id) -> bytes`), found once per model:
    every token of its vocabulary looked at (~0.3 s on the default model, ~1.6 s on Gemma's
    262,144). DRY itself reads `breaker_table` instead, which looks at the tokens it meets."""
    model = _STANDS_FOR.get(model, model)
    ids = _MODEL_BREAKERS.get(model)
    if ids is None:
        ids = _MODEL_BREAKERS[model] = breaker_ids(model.piece(i) for i in range(model.n_vocab))
    return ids


class BreakerTable:
    """A model's breaker tokens, each looked up the first time DRY meets it (a context's tokens,
    the candidates a repeat would extend): the same answers as model_breakers without reading
    the whole vocabulary before a reply's first DRY step. -1 not looked up yet, 0 no, 1 a breaker."""

    def __init__(self, model: Any) -> None:
        self._model = weakref.ref(model)  # (the table lives in a WeakKeyDictionary keyed by it)
        # (a bytearray, 0xff read as int8's -1, and numpy's view of it: a lookup stores a byte, not a numpy
        # scalar, and the membership test below is no generator's: ~20 us a step after a forward pass)
        self._bytes = bytearray(b"\xff") * int(model.n_vocab)
        self._table = np.frombuffer(self._bytes, dtype=np.int8)

    def _look_up(self, i: int) -> int:
        model = self._model()
        piece = model.piece(i) if model is not None else b""
        flag = 1 if (b"\n" in piece or b":" in piece or b'"' in piece or b"*" in piece) else 0  # (BREAKERS)
        self._bytes[i] = flag
        return flag

    def last_in(self, tokens: np.ndarray) -> int:
        """The position of the last breaker among `tokens` (int64; -1: none): the kernel's pass from
        the end (last_flagged), each token not looked up yet looked up as it is met (a few at a
        reply's first steps: then mask() looks up all of them at once); else mask()'s."""
        kernel = sampler_fused.kernel
        if kernel is not None and tokens.dtype == np.int64 and tokens.flags.c_contiguous:
            for _ in range(_LOOKUPS):
                at, unknown = kernel.last_flagged(tokens, self._table)
                if unknown < 0:
                    return int(at)
                self._look_up(int(unknown))
        return _last_of(self.mask(tokens))

    def mask(self, tokens: np.ndarray) -> np.ndarray:
        """Which of `tokens` are breakers (an id outside the vocabulary is not)."""
        table = self._table
        if tokens.shape[0] <= _FEW:  # (DRY's few penalized ids: a lookup each, not numpy's passes)
            n = table.shape[0]
            return np.array(
                [0 <= i < n and (table[i] if table[i] >= 0 else self._look_up(i)) == 1 for i in tokens.tolist()],
                dtype=bool,
            )
        inside = (tokens >= 0) & (tokens < table.shape[0])
        at = np.where(inside, tokens, 0)
        known = table[at]
        new = np.unique(at[(known < 0) & inside])
        if new.size:
            for i in new.tolist():
                self._look_up(i)
            known = table[at]
        return inside & (known == 1)

    def __contains__(self, token: object) -> bool:
        try:
            i = operator.index(token)  # type: ignore[arg-type]
        except TypeError:
            return False
        return bool(self.mask(np.array([i], dtype=np.int64))[0])


#: BreakerTable.last_in's lookups one at a time before mask() looks up every token at once
_LOOKUPS = 8
#: BreakerTable.mask looks these few tokens up one by one
_FEW = 16

_BREAKER_TABLES: WeakKeyDictionary[Any, BreakerTable] = WeakKeyDictionary()


def breaker_table(model: Any) -> BreakerTable:
    """`model`'s BreakerTable (one per model, reached through its stand-ins too)."""
    model = _STANDS_FOR.get(model, model)
    table = _BREAKER_TABLES.get(model)
    if table is None:
        table = _BREAKER_TABLES[model] = BreakerTable(model)
    return table


class History(list):
    """The context's token ids (the engine appends each token drawn) and, for DRY, the
    model whose breaker tokens it needs (None: no breakers); `tail(n)`, the last n as int64, kept
    beside the list: each token converted once, not the whole context each step (after a forward
    pass converting its ints cost ~20 us a step: docs/performance.md, "twenty-fourth session")."""

    def __init__(self, tokens: Iterable[int] = (), model: Any = None) -> None:
        super().__init__(tokens)
        self.model = model
        self._ids = np.empty(0, dtype=np.int64)
        self._synced = 0  # (how many of the first tokens _ids holds)

    def tail(self, n: int) -> np.ndarray:
        """The last n tokens (n <= len(self)) as a contiguous int64 array: a view, valid until the next change."""
        m = len(self)
        if self._synced > m:
            self._synced = 0
        if self._ids.shape[0] < m:
            grown = np.empty(max(2 * m, 256), dtype=np.int64)
            grown[: self._synced] = self._ids[: self._synced]
            self._ids = grown
        if self._synced < m:
            if self._synced == m - 1:  # (a step's one new token: an int stored, not a list converted)
                self._ids[m - 1] = self[m - 1]
            else:
                self._ids[self._synced : m] = self[self._synced : m]
            self._synced = m
        return self._ids[m - n : m]

    def _changed(self) -> None:
        self._synced = 0  # (any change but an append or an extend: tail converts them all again)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._changed()
        super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        self._changed()
        super().__delitem__(key)

    def insert(self, index: Any, value: Any) -> None:
        self._changed()
        super().insert(index, value)

    def pop(self, index: Any = -1) -> Any:
        self._changed()
        return super().pop(index)

    def remove(self, value: Any) -> None:
        self._changed()
        super().remove(value)

    def clear(self) -> None:
        self._changed()
        super().clear()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._changed()
        super().sort(*args, **kwargs)

    def reverse(self) -> None:
        self._changed()
        super().reverse()

    @property
    def breakers(self) -> frozenset[int] | BreakerTable:
        return frozenset() if self.model is None else breaker_table(self.model)


#: (the breakers set last seen, its lookup table): one tuple, swapped whole (threads)
_mask_cache: tuple = (None, None)


def _is_breaker(tokens: np.ndarray, breakers: frozenset[int] | set[int] | BreakerTable) -> np.ndarray:
    """tokens' entries that are breakers, through a boolean table indexed by id (built
    once for the same set object; np.isin cost too much a step: docs/performance.md, "DRY's
    breaker lookup"), or a model's BreakerTable."""
    if isinstance(breakers, BreakerTable):
        return breakers.mask(tokens)
    global _mask_cache
    seen, table = _mask_cache
    if seen is not breakers:
        table = np.zeros(max(breakers, default=-1) + 1, dtype=np.bool_)
        table[np.fromiter(breakers, dtype=np.intp, count=len(breakers))] = True
        _mask_cache = (breakers, table)
    inside = (tokens >= 0) & (tokens < table.shape[0])
    return inside & table[np.where(inside, tokens, 0)] if table.shape[0] else inside


def _last_of(flags: np.ndarray) -> int:
    hits = np.flatnonzero(flags)
    return int(hits[-1]) if hits.size else -1


def enabled(multiplier: float, base: float, last_n: int) -> bool:
    """llama.cpp's test: DRY does nothing with multiplier 0, base below 1 or last_n 0."""
    return multiplier != 0.0 and base >= 1.0 and last_n != 0


def _match_lengths(a: np.ndarray, rep_limit: int) -> np.ndarray:
    """For each end position e < N-1 of `a`: how many tokens the sequence ending at e has
    in common with the one ending at the context's end (compared backwards), at most
    rep_limit. (llama.cpp's Z-algorithm pass computes the same numbers: its
    dry_repeat_count.) Only the positions still matching are compared, in blocks of
    offsets that double up to _BLOCK: a repeat of L tokens costs about log2(L) + L/_BLOCK
    vectorised comparisons, not L."""
    n = a.shape[0]
    counts = np.zeros(n - 1, dtype=np.intp)
    if rep_limit <= 0:
        return counts
    alive = np.flatnonzero(a[: n - 1] == a[n - 1])
    counts[alive] = 1
    j, width = 1, 1  # every alive position matches offsets 0 .. j-1
    while alive.size and j < rep_limit:
        width = min(2 * width, _BLOCK, rep_limit - j)
        offsets = np.arange(j, j + width)
        at = alive[:, None] - offsets[None, :]  # the earlier sequence's tokens, backwards
        same = (at >= 0) & (a[np.maximum(at, 0)] == a[n - 1 - offsets][None, :])
        whole = same.all(axis=1)
        counts[alive] = j + np.where(whole, width, same.argmin(axis=1))  # up to the first mismatch
        alive = alive[whole]
        j += width
    return counts


#: the widest block of offsets _match_lengths compares at once
_BLOCK = 64


def _longest_numpy(a: np.ndarray, rep_limit: int, allowed_length: int) -> tuple[np.ndarray, np.ndarray]:
    """`penalties`' steps 2 and 3 in numpy: (the tokens that would extend a repeat of at least
    allowed_length, ascending; each one's longest repeat)."""
    counts = _match_lengths(a, rep_limit)
    where = np.flatnonzero(counts >= allowed_length)
    following = a[where + 1]
    ids, inverse = np.unique(following, return_inverse=True)
    longest = np.zeros(ids.shape[0], dtype=np.intp)
    np.maximum.at(longest, inverse, counts[where])
    return ids, longest


def _longest_kernel(a: np.ndarray, rep_limit: int, allowed_length: int) -> tuple[np.ndarray, np.ndarray] | None:
    """_longest_numpy in one call of the kernel (its dry_longest: the reversed context's Z-array, as
    llama.cpp's, O(n)); the same integers. None: no kernel."""
    kernel = sampler_fused.kernel
    if kernel is None:
        return None
    m = max(a.shape[0] - 1, 1)
    # (scratch memory: two fresh arrays a step cost ~10 us after a forward pass; the step's views, read
    # before the next step writes there: penalties' answer is made of new arrays)
    ids, longest = scratch.get("dry_ids", m, np.int64), scratch.get("dry_longest", m, np.int64)
    k = kernel.dry_longest(a, rep_limit, allowed_length, ids, longest)
    return ids[:k], longest[:k]


def penalties(
    context: Sequence[int],
    breakers: frozenset[int] | set[int] | BreakerTable,
    multiplier: float,
    base: float,
    allowed_length: int,
    last_n: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, the amount to subtract from each one's logit: float32), in id order.

    `context`: every token id so far (prompt and reply); `last_n` of them are looked at
    (-1: all of them, as llama.cpp's command line; the setting takes 0 and up); `breakers`:
    the ids of the sequence-breaker tokens."""
    if not enabled(multiplier, base, last_n):
        return _EMPTY
    n = len(context) if last_n < 0 else min(len(context), last_n)
    if n <= allowed_length or n == 0:
        return _EMPTY
    a = context.tail(n) if isinstance(context, History) else np.asarray(context[len(context) - n :], dtype=np.int64)
    # step 1: the repeat may not reach back past the last breaker
    rep_limit = n
    if breakers:
        last = breakers.last_in(a) if isinstance(breakers, BreakerTable) else _last_of(_is_breaker(a, breakers))
        if last >= 0:
            rep_limit = n - 1 - last
    if rep_limit < allowed_length:
        return _EMPTY
    # steps 2 and 3: the length of the repeat that ends at each earlier position; the token after
    # each such position would extend it: the longest per token (the kernel: one call, the same integers)
    longest_of = _longest_kernel(a, rep_limit, allowed_length)
    ids, longest = _longest_numpy(a, rep_limit, allowed_length) if longest_of is None else longest_of
    if ids.size == 0:
        return _EMPTY
    # step 4: a breaker is never penalized; the exponent is clamped as llama.cpp's
    if breakers:
        keep = ~_is_breaker(ids, breakers)
        ids, longest = ids[keep], longest[keep]
    base32, mult32 = float(np.float32(base)), float(np.float32(multiplier))
    exp = longest - allowed_length
    if base32 > 1.000001:
        max_exp = int(np.float32(FLOAT_MAX_LOG) / np.float32(math.log(base32)))
        if max_exp > 0:
            exp = np.minimum(exp, max_exp)
    pen = (mult32 * np.power(base32, exp.astype(np.float64))).astype(np.float32)
    return ids.astype(np.intp), pen


def step_penalties(recent_tokens: Sequence[int], settings: Any, n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The sampler's hook: `penalties` for one step with the settings' dry_* values
    (breakers from `recent_tokens.breakers` when it is a History), ids below n_vocab."""
    if not enabled(settings.dry_multiplier, settings.dry_base, settings.dry_penalty_last_n):
        return _EMPTY
    ids, pen = penalties(
        recent_tokens,
        getattr(recent_tokens, "breakers", frozenset()),
        settings.dry_multiplier,
        settings.dry_base,
        settings.dry_allowed_length,
        settings.dry_penalty_last_n,
    )
    if ids.size and (ids[0] < 0 or ids[-1] >= n_vocab):
        ok = (ids >= 0) & (ids < n_vocab)
        ids, pen = ids[ok], pen[ok]
    return ids, pen
