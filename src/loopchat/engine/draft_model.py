"""A draft model opened beside the model it drafts for (speculative decoding: drafts.py's
ModelDrafter on an Engine of its own), refused in one line when its vocabulary differs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loopchat.engine.drafts import ModelDrafter, vocabulary_problem
from loopchat.engine.engine import Engine
from loopchat.errors import ModelLoadError


def open_draft_model(target: Any, path: str | Path, threads: int | None = None) -> ModelDrafter:
    """A ModelDrafter on the GGUF at `path` for `target` (an Engine). ModelLoadError, in one
    line, when its vocabulary is not the target's (the draft model is closed again)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"the draft model {str(path)!r} is not a file: give the path of a GGUF file")
    engine = Engine(path, n_ctx=target.n_ctx, threads=threads or target.threads, warmup=False)
    problem = vocabulary_problem(target, engine)
    if problem is not None:
        engine.close()
        raise ModelLoadError(
            f"the draft model {path.name} cannot draft for {target.name}: {problem}; "
            "a draft model must have the same vocabulary (e.g. a smaller model of the same family)"
        )
    return ModelDrafter(engine)
