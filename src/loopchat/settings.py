"""Sampling settings: one immutable object, swapped whole while a reply is generating.

The generation loop reads the current object at every step and records it in that
step's event, so a change made between two steps is visible exactly where it applied.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, fields
from typing import Any, Callable


class SettingsError(ValueError):
    """An out-of-range or mistyped sampling setting; the message says what is allowed."""


# name -> (type, minimum, maximum, what it means). Bounds are inclusive.
_LIMITS: dict[str, tuple[type, float, float, str]] = {
    "temperature": (float, 0.0, 5.0, "0 means greedy (always the most likely token)"),
    "top_k": (int, 0, 1_000_000, "0 disables top-k"),
    "top_p": (float, 0.0, 1.0, "1.0 disables top-p; must be above 0"),
    "min_p": (float, 0.0, 1.0, "0 disables min-p"),
    "repeat_penalty": (float, 0.1, 5.0, "1.0 disables the penalty"),
    "repeat_last_n": (int, 0, 100_000, "how many recent tokens the repeat penalty looks at"),
    "seed": (int, 0, 2**32 - 1, "any whole number from 0 to 4294967295"),
    "max_tokens": (int, 1, 1_000_000, "the most tokens one reply may have"),
}


@dataclass(frozen=True, slots=True)
class SamplingSettings:
    """What the sampler does at one step. Immutable: change it with `replace`."""

    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    repeat_last_n: int = 64
    seed: int = 0
    max_tokens: int = 512

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            kind, lo, hi, hint = _LIMITS[f.name]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SettingsError(f"{f.name} must be a number, got {value!r} ({hint})")
            if kind is int and not float(value).is_integer():
                raise SettingsError(f"{f.name} must be a whole number, got {value!r} ({hint})")
            if not (lo <= value <= hi):
                raise SettingsError(f"{f.name} must be between {lo:g} and {hi:g}, got {value!r} ({hint})")
            object.__setattr__(self, f.name, kind(value))
        if self.top_p <= 0.0:
            raise SettingsError("top_p must be above 0 (1.0 disables top-p)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def replace(self, **changes: Any) -> "SamplingSettings":
        """A new object with some fields changed (validated like the constructor)."""
        unknown = set(changes) - set(_LIMITS)
        if unknown:
            raise SettingsError(
                f"unknown sampling setting(s): {', '.join(sorted(unknown))}; "
                f"known: {', '.join(_LIMITS)}"
            )
        return dataclasses.replace(self, **changes)

    def diff(self, other: "SamplingSettings | None") -> tuple[str, ...]:
        """Names of the fields whose value differs from `other` (all of them if None)."""
        if other is None or other is self:
            return ()
        return tuple(f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SamplingSettings":
        unknown = set(data) - set(_LIMITS)
        if unknown:
            raise SettingsError(
                f"unknown sampling setting(s): {', '.join(sorted(unknown))}; "
                f"known: {', '.join(_LIMITS)}"
            )
        return cls(**data)

    @staticmethod
    def field_names() -> tuple[str, ...]:
        return tuple(_LIMITS)

    @staticmethod
    def describe(name: str) -> str:
        kind, lo, hi, hint = _LIMITS[name]
        return f"{name}: {kind.__name__} from {lo:g} to {hi:g} ({hint})"


class LiveSettings:
    """The settings source a generation loop reads at every step.

    `set` swaps the whole immutable object (an atomic reference assignment); the loop
    picks it up at its next step. Safe to call from any thread.
    """

    def __init__(self, initial: SamplingSettings | None = None) -> None:
        self._current = initial or SamplingSettings()
        self._lock = threading.Lock()
        self._listeners: list[Callable[[SamplingSettings], None]] = []

    def get(self) -> SamplingSettings:
        return self._current

    __call__ = get

    def set(self, settings: SamplingSettings) -> SamplingSettings:
        if not isinstance(settings, SamplingSettings):
            raise TypeError("LiveSettings.set takes a SamplingSettings")
        self._current = settings
        for listener in list(self._listeners):
            listener(settings)
        return settings

    def update(self, **changes: Any) -> SamplingSettings:
        """Replace some fields (validated); returns the new settings object."""
        with self._lock:
            return self.set(self._current.replace(**changes))

    def subscribe(self, listener: Callable[[SamplingSettings], None]) -> None:
        """Call `listener(new_settings)` after every change (on the changing thread)."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[SamplingSettings], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)
