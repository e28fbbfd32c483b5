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
#: gbnf_to_lark's errors without a position: a rule used and not defined
_MISSING_RULE = re.compile(r"^Rule '([^']+)' not found$")


def _fail(c: Constraint, message: str) -> ConstraintError:
    return ConstraintError(f"{c.kind_name} {c.source or 'in the request'}: {one_line(message)}")


def _lark_message(text: str) -> str:
    """llguidance's error (several lines, a caret under the spot) as 'line L, column C: what'."""
    first = next((line for line in text.splitlines() if line.strip()), text)
    at = _LARK_AT.match(first)
    if at:
        return f"line {at.group(1)}, column {at.group(2)}: {first[at.end() :]}"
    return first


def _at(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    return f"line {line}, column {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"


def _gbnf_message(text: str, exc: Exception) -> str:
    """gbnf_to_lark's error with its position as 'line L, column C' (a rule used and not
    defined: where it is first used)."""
    pos = getattr(getattr(exc, "pos", None), "pos", None)
    if isinstance(pos, int):
        return f"{_at(text, pos)}: {str(exc).split(' at line ')[0]}"
    missing = _MISSING_RULE.match(str(exc))
    if missing:
        use = re.search(rf"(?<![\w-]){re.escape(missing.group(1))}(?![\w-])(?!\s*::=)", text)
        if use:
            return f"{_at(text, use.start())}: rule {missing.group(1)!r} is used and not defined"
    return str(exc)


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
            raise _fail(c, _gbnf_message(c.text, exc)) from None
    return str(LLMatcher.grammar_from_lark(text))


def check(c: Constraint, tokenizer: Any = None) -> str:
    """The grammar of `c`, validated (with the model's tokenizer when given); ConstraintError
    (one line: where it came from, the position, what is wrong) if it cannot be used."""
    grammar = grammar_of(c)
    problem = LLMatcher.validate_grammar(grammar, tokenizer)
    if problem:
        raise _fail(c, _lark_message(problem))
    return grammar
