"""A Constraint (constraint.py) as llguidance's grammar, and its errors as one line each.

llguidance (the Rust engine behind llama.cpp's optional LLGuidance support, vLLM and SGLang)
takes Lark grammars, JSON schemas and regexes; a GBNF grammar (llama.cpp's format) is turned
into Lark by its own `gbnf_to_lark`. Nothing here is a grammar engine of loopchat's own.

`check` validates a constraint without a model (the CLI calls it before any reply, so a bad
file is one line naming the file and the position); `grammar_of` gives the grammar a
matcher is built from (engine/sampler_constraint.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

from llguidance import LLMatcher
from llguidance.gbnf_to_lark import any_to_lark

from loopchat.constraint import Constraint, ConstraintError
from loopchat.errors import one_line

#: Lark errors start "LINE(COLUMN): ..."
_LARK_AT = re.compile(r"^(\d+)\((\d+)\):\s*")
#: gbnf_to_lark's errors end "at line N, 'before' ^ 'after'"
_GBNF_AT = re.compile(r"\s+at line (\d+), (.*)$")


def _fail(c: Constraint, message: str) -> ConstraintError:
    return ConstraintError(f"{c.kind_name} {c.source or 'in the request'}: {one_line(message)}")


def _lark_message(text: str) -> str:
    """llguidance's error (several lines, a caret under the spot) as 'line L, column C: what'."""
    first = next((line for line in text.splitlines() if line.strip()), text)
    at = _LARK_AT.match(first)
    if at:
        return f"line {at.group(1)}, column {at.group(2)}: {first[at.end() :]}"
    return first


def _schema(c: Constraint) -> dict[str, Any]:
    if c.kind == "json":
        return {"type": "object"}
    try:
        schema = json.loads(c.text)
    except json.JSONDecodeError as exc:
        raise _fail(c, f"line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg})") from None
    if not isinstance(schema, dict):
        raise _fail(c, f"a JSON schema is an object, got {type(schema).__name__}")
    return schema


def grammar_of(c: Constraint) -> str:
    """llguidance's grammar for `c` (ConstraintError for a text it cannot read)."""
    if c.is_json:
        try:
            # compact JSON (no whitespace between tokens) unless the schema's x-guidance says otherwise
            return str(LLMatcher.grammar_from_json_schema(_schema(c), defaults={"whitespace_flexible": False}))
        except ValueError as exc:
            raise _fail(c, str(exc)) from None
    if c.kind == "regex":
        return str(LLMatcher.grammar_from_regex(c.text))
    text = c.text
    if c.kind == "grammar":
        try:
            text = any_to_lark(text)  # GBNF -> Lark (Lark is left as it is)
        except Exception as exc:  # gbnf_to_lark raises plain Exceptions for missing rules
            message = str(exc)
            at = _GBNF_AT.search(message)
            if at:
                message = f"line {at.group(1)} (at {at.group(2)}): {message[: at.start()]}"
            raise _fail(c, message) from None
    return str(LLMatcher.grammar_from_lark(text))


def check(c: Constraint, tokenizer: Any = None) -> str:
    """The grammar of `c`, validated (with the model's tokenizer when given); ConstraintError
    (one line: where it came from, the position, what is wrong) if it cannot be used."""
    grammar = grammar_of(c)
    problem = LLMatcher.validate_grammar(grammar, tokenizer)
    if problem:
        raise _fail(c, _lark_message(problem))
    return grammar
