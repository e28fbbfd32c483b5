"""`loopchat serve`: a request's constraint (issue 24): OpenAI's `response_format` and llama.cpp's `grammar`.

- `response_format: {"type": "text"}` (or none): no constraint;
- `{"type": "json_object"}`: any JSON object (OpenAI's JSON mode);
- `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}`:
  JSON that matches the schema (OpenAI's structured outputs: the SDK's `parse()` sends this);
- `grammar: "<GBNF or Lark>"` (llama.cpp's server field), or `json_schema: {...}` (also
  llama.cpp's): the reply follows it.

Each is checked here, before the reply (llguidance's own check: constraint_grammar.py); a
problem is a 400 that names the parameter and the position. The reply's Steps carry the
constraint's figures in the `loopchat` extension (event_json.to_json_dict).
"""

from __future__ import annotations

import json
from typing import Any

from loopchat.constraint import Constraint, ConstraintError
from loopchat.engine.constraint_grammar import check


class FormatProblem(ValueError):
    """A constraint the request asks for that cannot be used: the message and the parameter."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _response_format(fmt: Any) -> Constraint | None:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint.any_json()
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise FormatProblem(
                'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}: the schema '
                "is missing or not an object",
                "response_format.json_schema.schema",
            )
        return Constraint("json_schema", json.dumps(schema))
    raise FormatProblem(
        f'response_format must be {{"type": "text"}}, {{"type": "json_object"}} or {{"type": "json_schema", '
        f'"json_schema": {{...}}}}, got {json.dumps(fmt)}',
        "response_format",
    )


def constraint_of(body: dict[str, Any]) -> Constraint | None:
    """The constraint a request body asks for (None: none); FormatProblem for one it cannot use."""
    asked: list[tuple[str, Constraint | None]] = []
    if body.get("response_format") is not None:
        asked.append(("response_format", _response_format(body["response_format"])))
    grammar = body.get("grammar")
    if grammar is not None and grammar != "":
        if not isinstance(grammar, str):
            raise FormatProblem("grammar must be a string: a GBNF (llama.cpp's format) or Lark grammar", "grammar")
        asked.append(("grammar", Constraint("grammar", grammar)))
    schema = body.get("json_schema")
    if schema is not None:
        if not isinstance(schema, dict):
            raise FormatProblem("json_schema must be an object: a JSON schema", "json_schema")
        asked.append(("json_schema", Constraint("json_schema", json.dumps(schema))))
    chosen = [(key, c) for key, c in asked if c is not None]
    if len(chosen) > 1:
        raise FormatProblem(
            f"{' and '.join(k for k, _ in chosen)} both constrain the reply: send one of them", chosen[1][0]
        )
    if not chosen:
        return None
    key, constraint = chosen[0]
    assert constraint is not None
    try:
        check(constraint)
    except ConstraintError as exc:
        raise FormatProblem(str(exc), key) from None
    return constraint
