"""The logit lens (issue 26, part 1): what each layer would have said.

For a forward pass, the hidden state after each layer at the pass's position (the
tensor llama.cpp names `l_out-<layer>`, captured by _lens_ffi.py) is put through the
model's own final norm and output head, read from the GGUF file with the `gguf` package:

    h' = h / sqrt(mean(h^2) + eps) * output_norm.weight     (RMSNorm, eps from the file)
    z  = W h'        W: output.weight, or token_embd.weight when the head is tied

and z's softmax is what that layer would have said. The last layer's is the model's own
output (up to rounding: ggml's quantized matmul rounds activations to 8 bits; the
tolerance measured is in docs/trace-format.md). Each layer gives a `LensRow`: its top
token and probability, the drawn token's rank and probability, the entropy in bits.

Only architectures whose final norm and head are exactly these are read (`ARCHITECTURES`);
any other gets `lens_problem`'s one-line notice, never a wrong row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from loopchat.events import LensRow

#: architectures whose final norm is an RMSNorm with a weight (no bias, no logit softcap
#: or scale) followed by the head: the lens applies exactly that
ARCHITECTURES = ("llama", "gemma3", "qwen2", "qwen3")
#: a head of more elements than this is dequantized a slice at a time, not kept in float32
_KEEP_ELEMENTS = 40_000_000
_SLICE_ROWS = 16_384


class LensHead:
    """The final norm and the output head of one GGUF model file."""

    def __init__(self, path: Path) -> None:
        import gguf  # (only when a lens is asked for)

        from loopchat.engine.gguf_tensors import GGUFHeader

        header = GGUFHeader(Path(path))
        fields, tensors = header.fields, header.tensors
        self.arch = str(fields.get("general.architecture") or "?")
        self.problem = lens_problem(self.arch, fields, tensors)
        if self.problem:
            return
        self.eps = float(fields.get(f"{self.arch}.attention.layer_norm_rms_epsilon") or 1e-6)
        self.n_layer = int(fields.get(f"{self.arch}.block_count") or 0)
        self.norm = np.asarray(tensors["output_norm.weight"].data).view(np.float32).reshape(-1).copy()
        head = tensors.get("output.weight") or tensors["token_embd.weight"]
        self._head, self._type = head, head.type
        self.n_vocab, self.n_embd = int(head.shape[1]), int(head.shape[0])
        self._dequantize = gguf.quants.dequantize
        #: the head's activations are rounded to Q8_0 blocks by ggml (the vec_dot type of
        #: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 weights): the lens rounds them the same way
        self.q8 = head.type.name in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
        self._kept: np.ndarray | None = None
        if self.n_vocab * self.n_embd <= _KEEP_ELEMENTS:
            self._kept = self._rows(0, self.n_vocab)

    def _rows(self, a: int, b: int) -> np.ndarray:
        """Rows a..b of the head (vocabulary entries), float32 (n x n_embd)."""
        data = self._head.data[a:b]
        if self._type.name == "Q8_0":  # blocks of an fp16 scale and 32 int8: in numpy directly
            blocks = np.asarray(data).reshape(b - a, -1, 34)
            scales = blocks[:, :, :2].copy().view(np.float16).astype(np.float32)
            return (blocks[:, :, 2:].view(np.int8) * scales).reshape(b - a, -1)
        return np.asarray(self._dequantize(data, self._type), dtype=np.float32).reshape(b - a, -1)

    def normed(self, hidden: np.ndarray) -> np.ndarray:
        """The final RMSNorm of each row (layers x n_embd), float32 as ggml computes it."""
        h = hidden.astype(np.float32)
        scale = 1.0 / np.sqrt(np.mean(h.astype(np.float64) ** 2, axis=1, keepdims=True) + self.eps)
        return h * scale.astype(np.float32) * self.norm

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """Each row of hidden states (layers x n_embd) through the final norm and the head."""
        h = self.normed(hidden)
        if self.q8:
            h = q8_rounded(h)
        if self._kept is not None:
            return h @ self._kept.T
        out = np.empty((h.shape[0], self.n_vocab), dtype=np.float32)
        for a in range(0, self.n_vocab, _SLICE_ROWS):
            b = min(a + _SLICE_ROWS, self.n_vocab)
            out[:, a:b] = h @ self._rows(a, b).T
        return out


def q8_rounded(h: np.ndarray) -> np.ndarray:
    """Each row of `h` as ggml's CPU backend hands it to a Q8_0 dot product: in blocks of
    32, the scale max|x| / 127 stored as fp16, the values round(x / scale) (float scale).
    Then the head's matmul on these equals ggml's integer dot products up to the order of
    the sums: with it the last layer agrees with llama.cpp's logits to ~1e-5; without
    it a float32 head differs by up to ~0.26 in a logit (docs/trace-format.md)."""
    n, d = h.shape
    x = h.reshape(n, d // 32, 32)
    scale = np.abs(x).max(axis=2) / 127.0
    inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
    q = np.round(x * inv[:, :, None])
    return (q * scale.astype(np.float16).astype(np.float32)[:, :, None]).reshape(n, d).astype(np.float32)


def lens_problem(arch: str, fields: Mapping[str, object], tensors: Mapping[str, object]) -> str:
    """'' when the lens can read this model; else the one-line notice."""
    if arch not in ARCHITECTURES:
        return (
            f"no lens for this architecture ({arch}): loopchat applies the final norm and head of "
            f"{', '.join(ARCHITECTURES)} models only"
        )
    missing = [n for n in ("output_norm.weight",) if n not in tensors]
    if "output.weight" not in tensors and "token_embd.weight" not in tensors:
        missing.append("output.weight")
    if "output_norm.bias" in tensors or fields.get(f"{arch}.final_logit_softcapping") is not None:
        return f"no lens for this model ({arch} with a norm bias or a logit softcap the lens does not apply)"
    if missing:
        return f"no lens for this model: its file has no {', '.join(missing)} ({arch})"
    return ""


def lens_rows(
    head: LensHead, hidden: dict[int, np.ndarray], drawn: int, piece: Callable[[int], str]
) -> tuple[LensRow, ...]:
    """One row per layer, in order, for the pass whose hidden states are `hidden` and whose
    drawn token is `drawn`."""
    layers = sorted(hidden)
    z = head.logits(np.stack([hidden[n] for n in layers])).astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    rows = []
    for k, layer in enumerate(layers):
        pk = p[k]
        top = int(np.argmax(pk))
        nz = pk[pk > 0]
        entropy = float(-(nz * np.log2(nz)).sum())
        rank = int((pk > pk[drawn]).sum()) + 1
        rows.append(LensRow(layer, top, piece(top), float(pk[top]), rank, float(pk[drawn]), entropy))
    return tuple(rows)


def top_order(head: LensHead, hidden: np.ndarray, k: int) -> Sequence[int]:
    """The k most likely tokens of one hidden state through the head (tests)."""
    z = head.logits(hidden.reshape(1, -1))[0]
    return [int(i) for i in np.argsort(-z, kind="stable")[:k]]
