"""The model `loopchat serve` serves, as its routes name it (app.py): what a request's `model` may
say, and the card GET /v1/models lists."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from loopchat.serve.request_error import RequestError
from loopchat.settings import SamplingSettings


@dataclass(frozen=True)
class ServedModel:
    """The model behind the server, as /v1/models names it."""

    id: str  # the models.toml name, or the file name of a --model PATH.gguf
    file_name: str
    n_ctx: int
    n_vocab: int
    sampling: SamplingSettings  # a request's settings start from these (models.toml's)
    created: int = field(default_factory=lambda: int(time.time()))
    strict: bool = False  # --strict-model: a request must name this model (else any name is answered by it)

    @property
    def names(self) -> frozenset[str]:
        """What a request's `model` may say: the id, the file name, the file's stem."""
        stem = self.file_name[:-5] if self.file_name.lower().endswith(".gguf") else self.file_name
        return frozenset({self.id, self.file_name, stem})

    def check(self, name: str | None) -> None:
        """A request's `model`. The server holds one model: it answers any name (and none,
        and "") with it, as llama.cpp's servers do, so that code written for OpenAI
        (`model="gpt-4"`) runs unchanged; each response's `model` says which answered.
        With --strict-model a name it does not go by is a 404."""
        if self.strict and name is not None and name not in self.names:
            raise RequestError(
                f"model {name!r} is not served here: this server runs {self.id!r} and, started with "
                "--strict-model, answers only its names (GET /v1/models lists it)",
                status=404,
                param="model",
                code="model_not_found",
            )

    def card(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "model",
            "created": self.created,
            "owned_by": "loopchat",
            "loopchat": {"file": self.file_name, "n_ctx": self.n_ctx, "n_vocab": self.n_vocab},
        }
