"""The draft (speculative decoding, passes.py): a sampling setting of its own kind
(settings.SETTINGS' `draft` row), one of "off", "lookup" (prompt lookup: the context's own
n-grams propose what follows) and "model" (a draft model with the model's vocabulary).
Its typed, trace and wire forms are the word itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loopchat.passes import DRAFT_SOURCES

HINT = (
    "speculative decoding: off, lookup (the context's own n-grams propose what follows) or model "
    "(a draft model: --draft-model PATH or models.toml's draft); the text is the plain loop's"
)


class DraftProblem(ValueError):
    """Not a draft source (settings wraps it in SettingsError)."""


def check(value: Any) -> str:
    if value is None:
        return "off"
    if isinstance(value, str) and value.strip().lower() in DRAFT_SOURCES:
        return value.strip().lower()
    raise DraftProblem(f"must be one of {', '.join(DRAFT_SOURCES)}, got {value!r}")


def parse(text: str, first_token: Callable[[str], int] | None = None) -> str:
    return check(text.strip() or "off")


def text(value: Any, as_text: Any = None) -> str:
    return str(value)


def wire(value: Any) -> str:
    return str(value)


#: draft_max's default: the most tokens drafted for one pass
DRAFT_MAX = 8


def summary(value: str, draft_max: int = DRAFT_MAX) -> str:
    """The panel's summary item, with draft_max: 'draft lookup ≤8' ('' when off at the default length)."""
    return "" if value == "off" and draft_max == DRAFT_MAX else f"draft {value} ≤{draft_max}"


class _Kind:
    """The draft's forms, as its row of settings.SETTINGS holds them (SettingSpec.kind)."""

    choices = DRAFT_SOURCES
    check = staticmethod(check)
    parse = staticmethod(parse)
    text = staticmethod(text)
    wire = staticmethod(wire)
    summary = staticmethod(summary)


KIND = _Kind()
