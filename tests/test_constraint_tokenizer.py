"""llguidance's tokenizer of the model's vocabulary, its loop over the tokens in the C kernel
(`vocab_pieces`, sampler_constraint.llg_tokenizer): the same token bytes as
llguidance.llamacpp.lltokenizer_from_vocab reads in Python, for every token of the real default
model's vocabulary, and a tokenizer that tokenizes and masks as that function's does."""

from __future__ import annotations

import ctypes
import warnings

import llama_cpp
import numpy as np
import pytest
from llguidance import LLMatcher
from llguidance.llamacpp import lltokenizer_from_vocab
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from loopchat.engine import sampler_fused
from loopchat.engine.engine import Engine
from loopchat.engine.sampler_constraint import kernel_pieces, llg_tokenizer

pytestmark = pytest.mark.model


def reference_pieces(vocab: object) -> list[bytes]:
    """lltokenizer_from_vocab's loop, as llguidance 1.x writes it."""
    buf = ctypes.create_string_buffer(16 * 1024 + 1)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for t in range(llama_cpp.llama_vocab_n_tokens(vocab)):
            n = llama_cpp.llama_token_to_piece(vocab, t, buf, 16 * 1024, 0, True)
            tok = bytes(buf[:n])
            attr = llama_cpp.llama_token_get_attr(vocab, t)
            if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL or (
                attr & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED and tok.startswith(b"<") and tok.endswith(b">")
            ):
                tok = b"\xff" + tok
            out.append(tok)
    return out


def test_the_kernels_pieces_are_llguidances_tokens(engine: Engine) -> None:
    kernel = sampler_fused.kernel
    if kernel is None:
        pytest.skip("the C kernel was not built (LOOPCHAT_SAMPLER_KERNEL=0): llguidance's own loop runs")
    vocab = llama_cpp.llama_model_get_vocab(engine.llm.model)
    pieces = kernel_pieces(vocab)
    assert pieces is not None
    expected = reference_pieces(vocab)
    assert len(pieces) == len(expected) == engine.n_vocab
    assert pieces == expected
    assert sum(p.startswith(b"\xff") for p in pieces) > 0  # (the chat template's control tokens)
    with pytest.raises(ValueError, match="null address"):
        kernel.vocab_pieces(0, 1, 1, 1, 0, 0)


def test_the_tokenizer_masks_and_tokenizes_as_llguidances(engine: Engine) -> None:
    vocab = llama_cpp.llama_model_get_vocab(engine.llm.model)
    ours = llg_tokenizer(engine.llm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        theirs = lltokenizer_from_vocab(vocab)
    text = 'A "JSON" reply: {"name": "Ada", "age": 36} <|im_end|>'
    assert ours.tokenize_str(text) == theirs.tokenize_str(text)
    grammar = LLMatcher.grammar_from_json_schema('{"type": "object", "properties": {"n": {"type": "integer"}}}')
    reply = ours.tokenize_str('{"n": 42}')
    a, b = LLMatcher(ours, grammar, log_level=0), LLMatcher(theirs, grammar, log_level=0)
    for token in reply:
        masks = []
        for m in (a, b):
            mask = allocate_token_bitmask(1, engine.n_vocab)
            fill_next_token_bitmask(m, mask)
            masks.append(mask)
        assert np.array_equal(masks[0], masks[1])
        assert a.consume_token(token) and b.consume_token(token)
