"""Sampling settings: one immutable object, swapped whole while a reply is generating.

The generation loop reads the current object at every step and records it in that
step's event, so a change made between two steps is visible exactly where it applied.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from dataclasses import dataclass, fields
from typing import Any, Callable


class SettingsError(ValueError):
    """An out-of-range or mistyped sampling setting; the message says what is allowed."""


# name -> (type, minimum, maximum, what it means). Bounds are inclusive. The order is the
# one the panel and the settings dialog show.
_LIMITS: dict[str, tuple[type, float, float, str]] = {
    "temperature": (float, 0.0, 5.0, "0 means greedy (always the most likely token)"),
    "top_p": (float, 0.0, 1.0, "1.0 disables top-p; must be above 0"),
    "top_k": (int, 0, 1_000_000, "0 disables top-k"),
    "min_p": (float, 0.0, 1.0, "0 disables min-p"),
    "repeat_penalty": (float, 0.1, 5.0, "1.0 disables the penalty"),
    "repeat_last_n": (int, 0, 100_000, "how many recent tokens the repeat penalty looks at"),
    "seed": (int, 0, 2**32 - 1, "a whole number pins the draws: same seed, same reply; none (the default) draws a new seed for each reply"),
    "max_tokens": (int, 1, 1_000_000, "the most tokens one reply may have"),
}


#: Settings that may be None (meaning: chosen per reply, see the field's comment).
OPTIONAL = frozenset({"seed"})


def fmt_limit(x: float) -> str:
    """A limit as a person writes it: 1000000, 4294967295, 0.1 (never 1e+06)."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def new_seed() -> int:
    """A fresh random seed (what a reply uses when the seed is not pinned)."""
    return secrets.randbits(32)


@dataclass(frozen=True, slots=True)
class SamplingSettings:
    """What the sampler does at one step. Immutable: change it with `replace`."""

    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    repeat_last_n: int = 64
    #: None: a fresh random seed for each reply (the engine draws it, records it in the
    #: reply's Start and Step events, so a replay is exact); a number pins the draws.
    seed: int | None = None
    max_tokens: int = 512

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            kind, lo, hi, hint = _LIMITS[f.name]
            if value is None and f.name in OPTIONAL:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SettingsError(f"{f.name} must be a number, got {value!r} ({hint})")
            if kind is int and not float(value).is_integer():
                raise SettingsError(f"{f.name} must be a whole number, got {value!r} ({hint})")
            if not (lo <= value <= hi):
                raise SettingsError(f"{f.name} must be between {fmt_limit(lo)} and {fmt_limit(hi)}, got {value!r} ({hint})")
            object.__setattr__(self, f.name, kind(value))
        if self.top_p <= 0.0:
            raise SettingsError("top_p must be above 0 (1.0 disables top-p)")

    def with_seed(self, seed: int) -> "SamplingSettings":
        """These settings with the seed filled in if it is not pinned (self if it is)."""
        return self if self.seed is not None else dataclasses.replace(self, seed=seed)

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
    def limits(name: str) -> tuple[float, float]:
        """The lowest and highest value `name` may take."""
        _, lo, hi, _ = _LIMITS[name]
        return lo, hi

    @staticmethod
    def describe(name: str) -> str:
        kind, lo, hi, hint = _LIMITS[name]
        return f"{name}: {kind.__name__} from {fmt_limit(lo)} to {fmt_limit(hi)} ({hint})"


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
