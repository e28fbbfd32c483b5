"""A reply run's host without a model (engine/run_host.py's RunHost): the logits rows
recorded from the real default model (tests/data/run_logits.npz, by
tests/data/record_run_trace.py) returned pass by pass, the recorded Start's prompt, and
the pieces of the tokens the recorded events name. The run's phases then run exactly as
on the engine, with no llama.cpp in the process."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from loopchat.engine.chat_prompt import FittedPrompt
from loopchat.events import FinishReason, Message, Start
from loopchat.settings import SamplingSettings

LOGITS = Path(__file__).parent / "data" / "run_logits.npz"


class ReplayHost:
    def __init__(self, start: Start, rows: np.ndarray, pieces: dict[int, bytes], eog: frozenset[int]) -> None:
        self.name = start.model_name
        self.model_path = Path("recorded")
        self.model_size = start.model_size_bytes or 0
        self.n_ctx, self.n_vocab, self.n_batch = int(start.n_ctx or 0), int(start.n_vocab or 0), 512
        self.threads_auto = False
        self.threads = int(start.threads or 1)
        self.flash_attn = start.flash_attn  # as recorded (None: a trace from before it was)
        self.huge_pages_mb = start.huge_pages_mb
        self.tuner = None
        self._start = start
        self._control = {start.prompt_token_ids[i] for i in start.prompt_special}
        self._rows, self._pieces, self._eog = rows, pieces, eog
        self._n_past = 0
        self.forwarded: list[int] = []  # the tokens fed back, in order

    @classmethod
    def recorded(cls, start: Start) -> ReplayHost:
        data = np.load(LOGITS)
        pieces = {int(i): bytes.fromhex(str(p)) for i, p in zip(data["piece_ids"], data["pieces"])}
        eog = frozenset(int(i) for i, e in zip(data["piece_ids"], data["eog"]) if e)
        return cls(start, data["rows"], pieces, eog)

    def fit_prompt(self, messages: Sequence[Message], max_tokens: int) -> FittedPrompt:
        s = self._start
        return FittedPrompt(s.messages, s.prompt_text or "", list(s.prompt_token_ids or ()), None)

    def token_texts(self, tokens: Sequence[int]) -> tuple[str, ...]:
        return tuple(self._start.prompt_token_texts or ())

    def is_control(self, token_id: int) -> bool:
        return token_id in self._control

    def piece(self, token_id: int) -> bytes:
        return self._pieces[token_id]

    def piece_text(self, token_id: int) -> str:
        # (a stage's cut token may be one the recording never named: its text is then unknown)
        return self._pieces.get(token_id, b"").decode("utf-8", errors="replace")

    def is_eog(self, token_id: int) -> bool:
        return token_id in self._eog

    @property
    def n_past(self) -> int:
        return self._n_past

    def cached_tokens(self) -> np.ndarray:
        return np.zeros(0, dtype=np.intc)

    def keep_cached(self, n: int) -> None:
        self._n_past = n

    def prefill_threads(self) -> None:
        pass

    def evaluate(self, tokens: Sequence[int]) -> None:
        self._n_past += len(tokens)

    def sync(self) -> None:
        pass

    def logits(self) -> np.ndarray:
        return self._rows[len(self.forwarded)]

    def forward(self, token: int) -> None:
        self.forwarded.append(int(token))
        self._n_past += 1

    def decode_failure(self, exc: RuntimeError) -> tuple[FinishReason, str | None]:
        return FinishReason.ERROR, str(exc)

    def pass_threads(self) -> tuple[int, float]:
        return self.threads, 0.0

    def cancelled(self) -> bool:
        return False

    def end_reply(self) -> None:
        pass


def settings_of(event: dict) -> SamplingSettings:
    return SamplingSettings.from_dict(event["settings"])
