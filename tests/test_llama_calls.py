"""The per-token llama.cpp calls the C kernel makes by address (engine/_llama_ffi.py: logits_at,
is_eog_at, and piece_of: tests/test_token_bytes.py): the same answers as the ctypes calls they
replace, on the real default model."""

from __future__ import annotations

import pytest

from loopchat.engine.engine import Engine
from loopchat.events import Message, Step
from loopchat.settings import SamplingSettings

pytestmark = pytest.mark.model


def _both_ways(calls, attr: str, fn):
    """fn() through the kernel's call, then through ctypes (the kernel's call set aside)."""
    assert getattr(calls, attr) is not None  # (built: tests/test_sampler_kernel.py checks the build)
    first = fn()
    kept = getattr(calls, attr)
    setattr(calls, attr, None)
    try:
        return first, fn()
    finally:
        setattr(calls, attr, kept)


def test_the_kernels_calls_answer_as_the_ctypes_calls(engine: Engine) -> None:
    calls = engine._c
    eog, eog_ctypes = _both_ways(calls, "_eog_at", lambda: [t for t in range(engine.n_vocab) if calls.is_eog(t)])
    assert eog == eog_ctypes and eog  # (SmolLM2's end tokens)
    s = SamplingSettings(seed=3, max_tokens=4)
    steps = [e for e in engine.generate([Message("user", "Hi")], s) if isinstance(e, Step)]
    assert steps
    address, address_ctypes = _both_ways(calls, "_logits_at", calls.logits_address)
    assert isinstance(address, int) and address == address_ctypes
    row, row_ctypes = _both_ways(calls, "_logits_at", lambda: calls.logits_row_address(0))
    assert row == row_ctypes
