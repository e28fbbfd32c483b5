"""What it takes to create an Engine: picklable options, the factory a worker calls.

The options build the Engine (this module imports engine.py; engine.py knows nothing of
it), lazily: a process that only builds options for a worker, such as the parent of
`loopchat --host process`, need not import the engine, numpy and the sampler for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from loopchat.flash_attn_setting import FlashAttn
from loopchat.threads_setting import AUTO, Threads

if TYPE_CHECKING:
    from loopchat.config import ModelSpec
    from loopchat.engine.engine import Engine


@dataclass(frozen=True)
class EngineOptions:
    """Everything needed to create an Engine: picklable, so it can cross to a process.

    Calling it creates the Engine (use it as the factory of a worker)."""

    model_path: str
    name: str | None = None
    n_ctx: int = 4096
    threads: Threads = AUTO  # a pinned count, or "auto" (the engine chooses: thread_tuner.py)
    gpu_layers: int = 0
    n_batch: int = 512
    chat_template: str | None = None
    mode: str | None = None  # models.toml's `mode` (None: chosen by the model's template)
    log_path: str | None = None
    verbose: bool = False
    flash_attn: FlashAttn | None = None  # "auto" | "on" | "off"; None: the model's own (flash_attn.py)
    draft_model: str | None = None  # a draft model's GGUF path (speculative decoding: drafts.py)

    @classmethod
    def from_spec(
        cls,
        spec: ModelSpec,
        path: str | Path,
        *,
        verbose: bool = False,
        threads: Threads | None = None,
        log_path: str | Path | None = None,
        flash_attn: FlashAttn | None = None,
        draft_model: str | None = None,
    ) -> EngineOptions:
        """The options for configured model `spec`, whose file is at `path` (its resolve_file()).
        None: the spec's threads and flash_attn, and llama.cpp's log in paths.llama_log_path()."""
        if log_path is None:
            from loopchat.paths import llama_log_path

            log_path = llama_log_path()
        return cls(
            str(path),
            name=spec.name,
            n_ctx=spec.n_ctx,
            threads=threads if threads is not None else spec.threads,
            gpu_layers=spec.gpu_layers,
            chat_template=spec.chat_template,
            mode=spec.mode,
            log_path=str(log_path),
            verbose=verbose,
            flash_attn=flash_attn if flash_attn is not None else spec.flash_attn,
            draft_model=draft_model,
        )

    def __call__(self) -> Engine:
        from loopchat.engine.engine import Engine

        engine = Engine(
            self.model_path,
            name=self.name,
            n_ctx=self.n_ctx,
            threads=self.threads,
            gpu_layers=self.gpu_layers,
            n_batch=self.n_batch,
            chat_template=self.chat_template,
            mode=self.mode,
            log_path=Path(self.log_path) if self.log_path else None,
            verbose=self.verbose,
            flash_attn=self.flash_attn,
        )
        if self.draft_model is not None:  # (ModelLoadError, one line: another vocabulary, no file)
            from loopchat.engine.draft_model import open_draft_model

            try:
                engine.draft_model = open_draft_model(engine, self.draft_model)
            except Exception:
                engine.close()
                raise
        return engine
