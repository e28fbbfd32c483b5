"""The `flash_attn` setting's type: "auto" (llama.cpp decides when it creates the context:
on where the device runs flash attention, which every CPU does), "on" or "off". A contract:
models.toml's reader, the command line's --flash-attn and the engine all take it from here.

The default is "auto", as llama-server's: on the CPU it resolves to on, which measured
faster on Gemma 3 270M; the bundled SmolLM2-135M measured slower with it and defaults to
off (engine/flash_attn.py, model_default; docs/performance.md, "Flash attention")."""

from __future__ import annotations

from typing import Literal

FlashAttn = Literal["auto", "on", "off"]
FLASH_ATTN_AUTO: FlashAttn = "auto"
DEFAULT_FLASH_ATTN: FlashAttn = FLASH_ATTN_AUTO

_WORDS: dict[str, FlashAttn] = {"auto": "auto", "on": "on", "off": "off", "true": "on", "false": "off"}


def parse_flash_attn(value: object) -> FlashAttn:
    """The setting from "auto", on/off (the command line) or true/false (a models.toml boolean)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str) and value.strip().lower() in _WORDS:
        return _WORDS[value.strip().lower()]
    raise ValueError(f'must be "auto", on (true) or off (false), got {value!r}')


__all__ = ["DEFAULT_FLASH_ATTN", "FLASH_ATTN_AUTO", "FlashAttn", "parse_flash_attn"]
