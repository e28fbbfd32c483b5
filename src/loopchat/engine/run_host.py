"""What a reply run (run.py) needs of the model it runs on: `RunHost`.

The Engine is one (a `Llama` behind it). A host that replays recorded logits is another
(tests/replay_host.py): the run's phases then run without a model, and give the steps
the engine gave on the same logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from loopchat.constraint import Constraint
from loopchat.engine.chat_prompt import FittedPrompt
from loopchat.engine.prompt_scores import ScoreMemory
from loopchat.engine.thread_tuner import ThreadTuner
from loopchat.events import FinishReason, Message


class RunHost(Protocol):
    # ---- what the Start event says of the model ----
    name: str
    n_ctx: int
    n_vocab: int
    n_batch: int
    model_path: Path
    model_size: int
    threads_auto: bool
    flash_attn: str | None  # "on" | "off" as llama.cpp resolved it (None: not known)
    huge_pages_mb: int | None  # the model's memory in 2 MB pages (huge_pages.py; None: not known)

    @property
    def threads(self) -> int:
        """The llama.cpp thread count in force."""
        ...

    # ---- tokens ----
    def fit_prompt(self, messages: Sequence[Message], max_tokens: int) -> FittedPrompt: ...

    def token_texts(self, tokens: Sequence[int]) -> tuple[str, ...]: ...

    def is_control(self, token_id: int) -> bool: ...

    def piece(self, token_id: int) -> bytes: ...

    def piece_text(self, token_id: int) -> str: ...

    def is_eog(self, token_id: int) -> bool: ...

    def text_tokens(self, text: str) -> list[int]:
        """`text`'s tokens as the tokenizer splits it alone (no BOS, no special tokens parsed)."""

    def first_token(self, text: str) -> int:
        """The first token of `text` as the tokenizer splits it alone (no BOS, no special
        tokens parsed); ValueError: it has none."""

    # ---- the context and the forward passes ----
    @property
    def n_past(self) -> int:
        """Tokens in the context (the KV cache)."""
        ...

    def cached_tokens(self) -> np.ndarray:
        """The tokens the KV cache holds, in order."""
        ...

    def keep_cached(self, n: int) -> None:
        """Keep the cache's first `n` tokens; the next evaluation goes on from there."""
        ...

    def prefill_threads(self) -> None:
        """Set the thread count a prefill runs at."""
        ...

    def evaluate(self, tokens: Sequence[int]) -> None:
        """One batch of tokens through the model (RuntimeError: llama.cpp failed)."""
        ...

    def sync(self) -> None: ...

    #: the cached tokens' prompt logprobs, and a chunk through the model with every
    #: position's logits kept (prompt_scores.py; only a request asking for prompt logprobs)
    prompt_memory: ScoreMemory

    def evaluate_scored(self, tokens: Sequence[int]) -> np.ndarray: ...

    def open_lens(self) -> Any:
        """The logit lens (lens_run.py: a PassLens, or a str: why this model has none)."""
        ...

    def open_constraint(self, spec: Constraint) -> Any:
        """The reply's constraint stage (sampler_constraint.ConstraintStage) on this model's
        vocabulary (ConstraintError: a grammar or schema it cannot use)."""
        ...

    def logits(self) -> np.ndarray:
        """The last pass's logits (valid until the next pass)."""
        ...

    def forward(self, token: int) -> None:
        """One token through the model, waited for (RuntimeError: llama.cpp failed)."""
        ...

    # ---- speculative decoding (speculate.py; only with a draft on: a replay host has none) ----
    def verify(self, tokens: Sequence[int]) -> np.ndarray:
        """A verifying pass: `tokens` (the one drawn, then the drafts) with every position's
        logits, a row each; the context then holds the first one (advance() adds each kept)."""
        ...

    def advance(self) -> None:
        """A draft the verifying pass kept: its KV cell is the context's."""
        ...

    def trim(self, n: int) -> None:
        """Keep the cache's first `n` positions and drop the cells after them."""
        ...

    def decode_failure(self, exc: RuntimeError) -> tuple[FinishReason, str | None]:
        """Why a failed pass ends the reply (a cancel, or an error message)."""
        ...

    # ---- threads and cancelling ----
    @property
    def tuner(self) -> ThreadTuner | None: ...

    def pass_threads(self) -> tuple[int, float]:
        """The last pass's thread count, and how long a probe ran before it was cut (0.0: none)."""
        ...

    def cancelled(self) -> bool: ...

    def end_reply(self) -> None:
        """The reply is over (a pending abort of a pass is cleared)."""
        ...
