"""The logit bias: a sampling setting of its own kind (settings.SETTINGS' `logit_bias`
row), a frozen tuple of (token id, bias) pairs, sorted by id, each bias -100..100
(OpenAI's `logit_bias`; engine/sampler_stages.LogitBias adds it to the token's logit).

Its forms: on the wire OpenAI's {"token id": bias}; typed (the F2 dialog, `loopchat run
--logit-bias`) entries `"TEXT"=BIAS` (the text's first token with the model's tokenizer)
or `ID=BIAS`, separated by commas: `" Paris"=5, " the"=-100, 1234=2.5`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

Bias = tuple[tuple[int, float], ...]

LO, HI = -100.0, 100.0
#: the most tokens one request may bias (OpenAI takes 300 too)
MAX_ENTRIES = 300
#: the typed form of one entry and the comma after it
_ENTRY = re.compile(r'\s*(?:("(?:[^"\\]|\\.)*")|(\d+))\s*=\s*([^,\s]+)\s*(?:,|$)')

HINT = 'token -> bias, -100 to 100 (-100 in effect bans the token, 100 forces it): e.g. " Paris"=5, 1234=-100'


class BiasProblem(ValueError):
    """What is wrong with a logit bias, in a few words (settings wraps it in SettingsError)."""


def _bias_value(raw: Any, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise BiasProblem(f"{where}: the bias must be a number, got {raw!r}")
    if not LO <= raw <= HI:
        raise BiasProblem(f"{where}: the bias must be between -100 and 100, got {raw!r}")
    return float(raw)


def _token_id(raw: Any) -> int:
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise BiasProblem(f"the token must be a token id (a whole number, 0 or more), got {raw!r}")
    return raw


def check(value: Any) -> Bias:
    """Any form the program meets ({"id": bias}, pairs, lists from JSON) as the setting's
    value; BiasProblem if it is not one. A token given twice: the last bias wins."""
    if value is None:
        return ()
    items = value.items() if isinstance(value, dict) else value
    if isinstance(items, (str, bytes)):
        raise BiasProblem('must be token ids with their biases, e.g. {"1234": 5}')
    out: dict[int, float] = {}
    try:
        pairs = [tuple(p) for p in items]
    except TypeError:
        raise BiasProblem('must be token ids with their biases, e.g. {"1234": 5}') from None
    for pair in pairs:
        if len(pair) != 2:
            raise BiasProblem(f"each entry is a token id and a bias, got {list(pair)!r}")
        token = _token_id(pair[0])
        out[token] = _bias_value(pair[1], f"token {token}")
    if len(out) > MAX_ENTRIES:
        raise BiasProblem(f"at most {MAX_ENTRIES} tokens may have a bias, got {len(out)}")
    return tuple(sorted(out.items()))


def wire(value: Bias) -> dict[str, float]:
    """OpenAI's form: {"token id": bias}."""
    return {str(t): b for t, b in value}


def fmt_bias(b: float) -> str:
    return f"{b:+g}"


def text(value: Bias, piece: Callable[[int], str | None] | None = None) -> str:
    """The typed form: `"TEXT"=BIAS` where `piece(id)` gives a text that is that token
    (else, or without `piece`, `ID=BIAS`)."""
    out = []
    for t, b in value:
        p = piece(t) if piece is not None else None
        out.append(f"{json.dumps(p, ensure_ascii=False) if p is not None else t}={b:g}")
    return ", ".join(out)


def parse(typed: str, first_token: Callable[[str], int] | None = None) -> Bias:
    """The typed form as the setting's value. `first_token(text)`: the model's first token of
    a text (None: no tokenizer at hand; a text entry is then a BiasProblem)."""
    pos, pairs = 0, []
    typed = typed.strip()
    while pos < len(typed):
        m = _ENTRY.match(typed, pos)
        if m is None or m.end() == pos:
            raise BiasProblem(f'cannot read {typed[pos:][:20]!r}: write "TEXT"=BIAS or ID=BIAS, comma between')
        quoted, number, raw_bias = m.groups()
        try:
            bias = float(raw_bias)
        except ValueError:
            raise BiasProblem(f"{raw_bias!r} is not a number: a bias is -100 to 100") from None
        if quoted is not None:
            word = json.loads(quoted)
            if not word:
                raise BiasProblem('"" has no token: write a text, e.g. " Paris"=5')
            if first_token is None:
                raise BiasProblem(f"{quoted}: no tokenizer at hand for a text: give the token id, e.g. 1234=5")
            pairs.append((first_token(word), _bias_value(bias, quoted)))
        else:
            pairs.append((int(number), bias))
        pos = m.end()
    return check(pairs)


def summary(value: Bias) -> str:
    """The panel's summary item: 'bias 2 tokens' ('' when none)."""
    if not value:
        return ""
    return f"bias {len(value)} token{'s' if len(value) != 1 else ''}"


class _Kind:
    """The logit bias's forms, as its row of settings.SETTINGS holds them (SettingSpec.kind)."""

    check = staticmethod(check)
    parse = staticmethod(parse)
    text = staticmethod(text)
    wire = staticmethod(wire)
    summary = staticmethod(summary)


KIND = _Kind()
