"""What a server's GET /models says about a model beyond its id: llama.cpp's
`llama-server` adds `meta` to each entry (`n_ctx`: the context of a request's slot,
`n_vocab`, `size`: the model's bytes). Other servers send none: every field None."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelMeta:
    n_ctx: int | None = None
    n_vocab: int | None = None
    size_bytes: int | None = None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def model_meta(entry: Any) -> ModelMeta:
    """The `meta` of one entry of GET /models' `data` (a ModelMeta of None for anything
    missing or not a positive whole number)."""
    meta = entry.get("meta") if isinstance(entry, dict) else None
    if not isinstance(meta, dict):
        return ModelMeta()
    return ModelMeta(
        n_ctx=_count(meta.get("n_ctx")), n_vocab=_count(meta.get("n_vocab")), size_bytes=_count(meta.get("size"))
    )
