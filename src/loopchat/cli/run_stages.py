"""`loopchat run`'s logit bias given as text (`--logit-bias TEXT=BIAS`, repeatable) and the
waterfall under each step (`--show-stages`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from loopchat.chat.views.panel_waterfall import waterfall_lines
from loopchat.errors import UsageError
from loopchat.events import Step
from loopchat.request import ReplyRequest
from loopchat.settings_bias import HI, LO, BiasProblem, check

_FORM = "write TEXT=BIAS, e.g. --logit-bias ' Paris=5' (BIAS from -100 to 100; -100 in effect bans the token)"


def cli_pairs(values: list[str] | None) -> list[tuple[str, float]]:
    """The --logit-bias values as (text, bias), checked (UsageError, one line)."""
    pairs = []
    for value in values or ():
        text, sep, raw = value.rpartition("=")
        if not sep or not text:
            raise UsageError(f"--logit-bias {value!r}: {_FORM}")
        try:
            bias = float(raw)
        except ValueError:
            raise UsageError(f"--logit-bias {value!r}: {raw!r} is not a number; {_FORM}") from None
        if not LO <= bias <= HI:
            raise UsageError(f"--logit-bias {value!r}: the bias must be between -100 and 100")
        pairs.append((text, bias))
    return pairs


def with_bias(request: ReplyRequest, values: list[str] | None, backend: Any) -> ReplyRequest:
    """`request` with the --logit-bias texts' first tokens (the loaded model's tokenizer) added
    to its settings' bias (the last one given wins for a token)."""
    pairs = cli_pairs(values)
    if not pairs:
        return request
    tokenizer = getattr(backend, "tokenizer", lambda: None)()
    first_token = tokenizer.first_token if tokenizer is not None else None
    if first_token is None:
        raise UsageError("--logit-bias needs the model's tokenizer: use it with a model run here, not --url")
    ids = []
    for text, bias in pairs:
        try:
            ids.append((first_token(text), bias))
        except ValueError:
            raise UsageError(f"--logit-bias: the model's tokenizer gives no token for {text!r}") from None
    try:
        bias_value = check([*request.settings.logit_bias, *ids])
    except BiasProblem as exc:
        raise UsageError(f"--logit-bias: {exc}") from None
    return dataclasses.replace(request, settings=request.settings.replace(logit_bias=bias_value))


def stage_lines(step: Step, width: int = 100) -> list[str]:
    """The step's waterfall as plain lines, indented under its step line ([] without reports)."""
    return ["      " + "".join(text for text, _ in line) for line in waterfall_lines(step, width)]
