"""A GGUF file's scalar metadata and tensors, read without parsing its arrays (the lens).

The `gguf` package's GGUFReader parses every metadata array element by element: the
tokenizer's strings (49,152 on the default model, 262,144 on Gemma) took 6 s and 23 s.
The lens needs a few scalars and two tensors, so this reads the header (GGUF v2/v3:
magic, version, tensor count, key-value count; each key-value; each tensor's name,
dimensions, type and offset) from the file's numpy.memmap, steps over arrays by their
sizes, and takes the tensors' bytes from the same mapping. Dequantizing stays with
`gguf.quants`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loopchat.model_files import GGUF_MAGIC

# GGUF value types -> struct format (8: string, 9: array are read apart)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # ggml's order: ne[0] (a row's length) first
    type: Any  # gguf.GGMLQuantizationType
    data: np.ndarray  # its bytes (uint8 memmap), one row of bytes per ne[1..] entry


class GGUFHeader:
    def __init__(self, path: Path) -> None:
        import gguf

        self.fields: dict[str, Any] = {}
        self.tensors: dict[str, Tensor] = {}
        # the header is read from the file's mapping too: no copy, and no size it must fit in
        mm = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size > 0 else np.zeros(0, np.uint8)
        self._buf = mm.data  # (a memoryview of the mapping)
        if bytes(self._buf[:4]) != GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file")
        self._at = 4
        try:
            infos = self._read_header(path)
        except (struct.error, KeyError) as exc:  # cut short, or a value type this does not know
            raise ValueError(f"{path}: its GGUF header could not be read ({exc})") from None
        align = int(self.fields.get("general.alignment") or 32)
        start = (self._at + align - 1) // align * align
        for name, dims, type_id, offset in infos:
            qtype = gguf.GGMLQuantizationType(type_id)
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            row = dims[0] // block * size
            rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
            data = mm[start + offset : start + offset + row * rows].reshape(rows, row)
            self.tensors[name] = Tensor(name, dims, qtype, data)
        del self._buf

    def _read_header(self, path: Path) -> list[tuple[str, tuple[int, ...], int, int]]:
        """The key-values (into `fields`) and the tensors' infos: (name, dims, type, offset)."""
        version = self._unpack("I")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not read (2 or 3 are)")
        n_tensors, n_kv = self._unpack("Q"), self._unpack("Q")
        for _ in range(n_kv):
            key = self._string()
            self.fields[key] = self._value(self._unpack("I"))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            dims = tuple(self._unpack("Q") for _ in range(self._unpack("I")))
            infos.append((name, dims, self._unpack("I"), self._unpack("Q")))
        return infos

    def _unpack(self, fmt: str) -> Any:
        value = struct.unpack_from("<" + fmt, self._buf, self._at)[0]
        self._at += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._unpack("Q")
        s = bytes(self._buf[self._at : self._at + n]).decode("utf-8", errors="replace")
        self._at += n
        return s

    def _value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:  # stepped over: the lens reads no array
            item, count = self._unpack("I"), self._unpack("Q")
            if item == _STRING:
                for _ in range(count):
                    self._at += 8 + struct.unpack_from("<Q", self._buf, self._at)[0]
            elif item == _ARRAY:
                for _ in range(count):
                    self._value(_ARRAY)
            else:
                self._at += struct.calcsize(_SCALARS[item]) * count
            return None
        return self._unpack(_SCALARS[vtype])
