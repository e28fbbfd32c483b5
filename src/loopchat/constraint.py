"""A reply's constraint (issue 24, item 3): a grammar or a JSON schema the reply must follow.

`Constraint` is the spec a `ReplyRequest` carries (small, frozen, picklable: it crosses the
process host's pipe); the engine builds llguidance's matcher from it for each reply
(engine/constraint_grammar.py) and runs it as a stage of the sampler's chain
(engine/sampler_constraint.py). `ConstraintReport` is what that stage says of one pass,
in the Step (docs/trace-format.md, "The constraint").

Kinds: "grammar" (llama.cpp's GBNF, or Lark), "lark", "regex", "json_schema" (the text is
the schema), "json" (any JSON object: no text).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from loopchat.errors import EngineError, one_line

KINDS = ("grammar", "lark", "regex", "json_schema", "json")
_NAMES = {"grammar": "grammar", "lark": "Lark grammar", "regex": "regex", "json_schema": "JSON schema", "json": "JSON"}


class ConstraintError(EngineError):
    """A grammar or schema that cannot be used: one line naming where it came from and the position."""


@dataclass(frozen=True, slots=True)
class Constraint:
    kind: str  # one of KINDS
    text: str = ""  # the grammar, regex or schema ("json": none)
    #: where the text came from (a file's path, "response_format", "models.toml"): errors name it
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(f"unknown constraint kind {self.kind!r}: use one of {', '.join(KINDS)}")

    @classmethod
    def any_json(cls, source: str = "") -> Constraint:
        """Any JSON object (OpenAI's json_object mode, `loopchat run --json`)."""
        return cls("json", "", source)

    @property
    def is_json(self) -> bool:
        """The reply is JSON (a schema or any object): it must parse with json.loads."""
        return self.kind in ("json", "json_schema")

    @property
    def kind_name(self) -> str:
        """The kind in words: 'grammar', 'JSON schema', ..."""
        return _NAMES[self.kind]

    def label(self) -> str:
        """A few words for the info line and the panel: 'JSON schema person.json', 'any JSON object'."""
        if self.kind == "json":
            return "any JSON object"
        where = Path(self.source).name if self.source else ""
        return f"{_NAMES[self.kind]} {where}".strip()


def read_constraint(kind: str, path: str | Path) -> Constraint:
    """The constraint in a file (ConstraintError, one line, if it cannot be read)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else one_line(str(exc))
        raise ConstraintError(f"cannot read the {_NAMES.get(kind, kind)} file {path}: {why}") from None
    return Constraint(kind, text, str(path))


class ConstraintReport(NamedTuple):
    """What the constraint did at one pass (docs/trace-format.md, "The constraint").

    Probabilities are the raw softmax's (the model's logits, before any stage), in float64."""

    allowed: int  # tokens of the vocabulary the constraint allowed
    forbidden_mass: float  # the raw probability of the tokens it forbade: 1 - the allowed tokens' raw mass
    top_forbidden_id: int  # the most likely token it forbade (-1: it forbade none)
    top_forbidden_text: str  # that token's text ("" when none)
    top_forbidden_prob: float  # its raw probability (0.0 when none)
    forced: bool  # exactly one token was allowed: the model had no say


def reply_summary(label: str, reports: Iterable[ConstraintReport]) -> str:
    """A reply's constraint in one phrase (the info line, `loopchat run`'s summary): how many
    passes were forced, and the forbidden raw mass summed over its passes and its mean a pass."""
    shown = [r for r in reports]
    forced = sum(1 for r in shown if r.forced)
    total = sum(r.forbidden_mass for r in shown)
    mean = f" ({total / len(shown):.3f} a pass)" if shown else ""
    return f"{label}: {forced} of {len(shown)} passes forced, forbidden mass {total:.3f} in all{mean}"


def cut_note(label: str) -> str:
    """The line for a reply cut (by max_tokens, the context) before its structure closed."""
    return f"the reply was cut before its structure closed ({label}): it is incomplete; raise max_tokens"


def wire_fields(c: Constraint | None) -> dict[str, Any]:
    """The request fields that ask a remote server for this constraint (`--url`): OpenAI's
    `response_format` for JSON (llama-server, vLLM and loopchat serve take it), llama.cpp's
    `grammar` for a grammar (loopchat serve reads Lark too), vLLM's `guided_regex` for a regex."""
    if c is None:
        return {}
    if c.kind == "json":
        return {"response_format": {"type": "json_object"}}
    if c.kind == "json_schema":
        schema = {"name": "reply", "schema": json.loads(c.text), "strict": True}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    if c.kind == "regex":
        return {"guided_regex": c.text}
    return {"grammar": c.text}
