"""Sampling settings: one table, and one immutable object swapped whole while a reply
is generating.

`SETTINGS` is the only place a sampling setting is spelled out: its type, default,
range, what it means, its CLI flag, its labels in the panel and the F2 dialog, its
Ctrl+Up/Down step, its name on the wire (OpenAI's or llama-server's) and its item in the
panel's summary line. The `SamplingSettings` dataclass takes its fields from the table,
and its checks, `loopchat run`'s flags, the F2 dialog, the panel, the F1 help, the branch
picker, the knob keys, the models.toml `[models.X.sampling]` checks, the request fields
`loopchat serve` accepts and those the remote backend sends all read it
(settings_text.py words it for the screen).

Adding a setting takes one row in `SETTINGS` (plus a test of what it does), and the
sampler (sampler.py) using it: everything else follows from the row.

The generation loop reads the current object at every step and records it in that
step's event, so a change made between two steps is visible exactly where it applied.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any


class SettingsError(ValueError):
    """An out-of-range or mistyped sampling setting; the message says what is allowed.

    `problem` is the short form, without the setting's name or hint ("must be between
    0 and 5, got 9.0"), for a form that shows it beside the field."""

    def __init__(self, message: str, problem: str | None = None) -> None:
        super().__init__(message)
        self.problem = problem or message


def fmt_limit(x: float) -> str:
    """A limit as a person writes it: 1000000, 4294967295, 0.1 (never 1e+06)."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@dataclass(frozen=True)
class SettingSpec:
    """One sampling setting: everything the program needs to know about it."""

    name: str  # the field of SamplingSettings, the models.toml key, the trace's key
    type: type  # int or float
    default: int | float | None
    lo: int | float  # the lowest value allowed (inclusive unless above_lo)
    hi: int | float  # the highest value allowed (inclusive)
    hint: str  # what the value means: error messages, `describe`, `loopchat run --help`
    dialog_hint: str  # the F2 dialog's short line beside the field
    short: str  # the compact panel's label
    label: str = ""  # the panel's label (default: the name)
    flag: str = ""  # `loopchat run`'s option (default: --name-with-dashes)
    knob_step: int | float | None = None  # the Ctrl+Up/Down step; None: not on the knob
    knob_lo: int | float | None = None  # the knob's floor when it is above `lo`
    above_lo: bool = False  # `lo` itself is not allowed (top_p must be above 0)
    optional: bool = False  # None is allowed (seed: a fresh random seed per reply)
    decimals: int | None = None  # digits shown after the point (default: 2 for floats, 0 for ints)
    spoken: str = ""  # its name in running text: the F1 help, the branch picker (default: top-p for top_p)
    symbol: str = ""  # its shortest form in running text (the branch picker's "T"; default: spoken)
    wire: str = ""  # its request field, OpenAI's or llama-server's name (default: the name)
    wire_aliases: tuple[str, ...] = ()  # other request fields `loopchat serve` takes for it (the last given wins)
    openai: bool = False  # in OpenAI's own API (else an extension, sent only with `extensions = true`)
    #: its item in the panel's summary line under the knobs ("max 512"; "" leaves it out);
    #: None: not there (a knob has its own row; a setting shown in another's item)
    summary: Callable[[SamplingSettings], str] | None = None
    wraps: bool = False  # its summary item goes on a second line when one line is too narrow

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.name)
        if not self.flag:
            object.__setattr__(self, "flag", "--" + self.name.replace("_", "-"))
        if self.decimals is None:
            object.__setattr__(self, "decimals", 0 if self.type is int else 2)
        if not self.spoken:
            object.__setattr__(self, "spoken", self.name.replace("_", "-"))
        if not self.symbol:
            object.__setattr__(self, "symbol", self.spoken)
        if not self.wire:
            object.__setattr__(self, "wire", self.name)

    @property
    def annotation(self) -> Any:
        """The dataclass field's type."""
        return self.type | None if self.optional else self.type

    def range_text(self) -> str:
        """The allowed values, as in `describe` and `--help`: '0 to 5', 'above 0, up to 1'."""
        if self.above_lo:
            return f"above {fmt_limit(self.lo)}, up to {fmt_limit(self.hi)}"
        return f"{fmt_limit(self.lo)} to {fmt_limit(self.hi)}"

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` for this setting ("must be ..., got ..."), or None."""
        if value is None and self.optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number, got {value!r}"
        if self.type is int and not float(value).is_integer():
            return f"must be a whole number, got {value!r}"
        if self.above_lo and not self.lo < value <= self.hi:
            return f"must be above {fmt_limit(self.lo)} and at most {fmt_limit(self.hi)}, got {value!r}"
        if not self.lo <= value <= self.hi:
            return f"must be between {fmt_limit(self.lo)} and {fmt_limit(self.hi)}, got {value!r}"
        return None

    def check(self, value: Any) -> int | float | None:
        """`value` as this setting's type; SettingsError if it is not allowed."""
        problem = self.problem(value)
        if problem is not None:
            raise SettingsError(f"{self.name} {problem} ({self.hint})", problem)
        return value if value is None else self.type(value)

    def parse(self, text: str) -> int | float | None:
        """A typed-in value (the F2 dialog), checked: '' is None for an optional setting."""
        text = text.strip()
        if not text:
            if self.optional:
                return None
            raise SettingsError(f"{self.name} is empty ({self.hint})", "is empty")
        try:
            value: int | float = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                problem = f"{text!r} is not a number"
                raise SettingsError(f"{self.name}: {problem} ({self.hint})", problem) from None
        return self.check(value)

    def nudge(self, value: int | float, direction: int) -> int | float:
        """The knob's next value from `value`: one step up (direction 1) or down (-1),
        kept within the knob's range and rounded to what the panel shows."""
        assert self.knob_step is not None, f"{self.name} is not on the knob"
        assert self.decimals is not None  # set by __post_init__
        lo = self.lo if self.knob_lo is None else self.knob_lo
        new = min(self.hi, max(lo, round(value + direction * self.knob_step, max(self.decimals, 2))))
        return self.type(new)


#: The sampling settings, in the order the panel and the F2 dialog show them.
SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec(
        "temperature",
        float,
        0.7,
        0.0,
        5.0,
        "0 means greedy: always the most likely token",
        "0–5 · 0 = greedy (always the top token)",
        short="temp",
        knob_step=0.1,
        symbol="T",
        openai=True,
    ),
    SettingSpec(
        "top_p",
        float,
        0.95,
        0.0,
        1.0,
        "1.0 disables top-p",
        "above 0, up to 1 · 1 = off",
        short="top_p",
        above_lo=True,
        knob_step=0.05,
        knob_lo=0.05,
        openai=True,
    ),
    SettingSpec(
        "top_k", int, 40, 0, 1_000_000, "0 disables top-k", "whole number · 0 = off", short="top_k", knob_step=5
    ),
    SettingSpec("min_p", float, 0.05, 0.0, 1.0, "0 disables min-p", "0–1 · 0 = off", short="min_p", knob_step=0.01),
    SettingSpec(
        "repeat_penalty",
        float,
        1.1,
        0.1,
        5.0,
        "1.0 disables the penalty",
        "0.1–5 · 1 = off",
        short="repeat",
        summary=lambda s: f"repeat ×{s.repeat_penalty:.2f} over {s.repeat_last_n}",
    ),
    SettingSpec(
        "repeat_last_n",
        int,
        64,
        0,
        100_000,
        "how many recent tokens the repeat penalty looks at",
        "tokens the penalty looks back over",
        short="last_n",
    ),
    SettingSpec(
        "dry_multiplier",
        float,
        0.0,
        0.0,
        5.0,
        "DRY's strength: a token that would extend a repeated "
        "sequence loses multiplier * base^(length - allowed_length) from its logit; 0 disables DRY",
        "0–5 · 0 = off (DRY)",
        short="dry",
        summary=lambda s: fmt_dry(s).removesuffix(" · "),  # (when on; it goes with the seed)
        wraps=True,
    ),
    SettingSpec(
        "dry_base",
        float,
        1.75,
        0.0,
        10.0,
        "how fast DRY's penalty grows with the sequence's length; below 1 disables DRY",
        "0–10 · below 1 = off",
        short="dry_base",
    ),
    SettingSpec(
        "dry_allowed_length",
        int,
        2,
        0,
        1000,
        "the longest repeated sequence DRY leaves alone",
        "tokens repeated without penalty",
        short="dry_len",
        label="dry_allowed_len",
    ),
    SettingSpec(
        "dry_penalty_last_n",
        int,
        64,
        0,
        100_000,
        "how many recent tokens DRY looks at (llama-server takes no -1); 0 disables DRY",
        "tokens DRY looks back over · 0 = off",
        short="dry_n",
        label="dry_last_n",
    ),
    SettingSpec(
        "seed",
        int,
        None,
        0,
        2**32 - 1,
        "a number pins the draws: same seed, same reply; none (the default) draws a fresh random seed for each reply",
        "empty = random each reply · a number pins it",
        short="seed",
        optional=True,
        openai=True,
        summary=lambda s: f"seed {fmt_value('seed', s.seed)}",
        wraps=True,
    ),
    SettingSpec(
        "max_tokens",
        int,
        512,
        1,
        1_000_000,
        "the most tokens one reply may have",
        "most tokens in one reply",
        short="max",
        openai=True,
        wire_aliases=("max_completion_tokens",),  # OpenAI's newer name
        summary=lambda s: f"max {s.max_tokens}",
    ),
)

#: name -> its row
SETTING: dict[str, SettingSpec] = {s.name: s for s in SETTINGS}

#: The settings Ctrl+Up/Down change (F8 goes through them in this order).
KNOBS: tuple[str, ...] = tuple(s.name for s in SETTINGS if s.knob_step is not None)


def fmt_value(name: str, value: int | float | None) -> str:
    """A setting's value as the panel shows it: 'random' for an unpinned seed, whole
    numbers plain, other numbers with the row's decimals (0.70)."""
    if value is None:
        return "random"
    spec = SETTING[name]
    if spec.type is int:
        return str(int(value))
    return f"{value:.{spec.decimals}f}"


#: The settings sent to a remote server beyond OpenAI's own (llama-server's names)
EXTENSION_KEYS: tuple[str, ...] = tuple(s.wire for s in SETTINGS if not s.openai)


def wire_values(settings: SamplingSettings, extensions: bool = True) -> dict[str, Any]:
    """The request fields that carry `settings` to a server, by their wire names: OpenAI's
    own, and the extensions too when `extensions` (an unpinned seed is left out)."""
    return {
        spec.wire: value
        for spec in SETTINGS
        if (spec.openai or extensions) and (value := getattr(settings, spec.name)) is not None
    }


def fmt_dry(s: SamplingSettings) -> str:
    """The panel's DRY item, before the seed: 'DRY 0.80×1.75^(len−2) over 64 · ', or ''
    when DRY is off."""
    if s.dry_multiplier == 0.0 or s.dry_base < 1.0 or s.dry_penalty_last_n == 0:
        return ""
    return f"DRY {s.dry_multiplier:.2f}×{s.dry_base:.2f}^(len−{s.dry_allowed_length}) over {s.dry_penalty_last_n} · "


def new_seed() -> int:
    """A fresh random seed (what a reply uses when the seed is not pinned)."""
    return secrets.randbits(32)


def _unknown(names: Any) -> None:
    unknown = set(names) - SETTING.keys()
    if unknown:
        raise SettingsError(f"unknown sampling setting(s): {', '.join(sorted(unknown))}; known: {', '.join(SETTING)}")


def _fields_from_table(cls: type) -> type:
    """Give `cls` one field per row of SETTINGS (its name, type and default), in order."""
    cls.__annotations__ = {s.name: s.annotation for s in SETTINGS}
    for s in SETTINGS:
        setattr(cls, s.name, s.default)
    return cls


@dataclass(frozen=True, slots=True)
@_fields_from_table
class SamplingSettings:
    """What the sampler does at one step. Immutable: change it with `replace`.

    Its fields are the rows of SETTINGS: temperature, top_p, top_k, min_p,
    repeat_penalty, repeat_last_n, the dry_* ones (dry.py), seed, max_tokens. A seed of None means a fresh random
    seed for each reply (the engine draws it and records it in the reply's Start and Step
    events, so a replay is exact); a number pins the draws."""

    if TYPE_CHECKING:
        # The fields come from the SETTINGS table at run time (`_fields_from_table`), out of
        # mypy's sight: for it, the constructor takes them by name and each reads as Any.
        def __init__(self, **values: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

    def __post_init__(self) -> None:
        for spec in SETTINGS:
            object.__setattr__(self, spec.name, spec.check(getattr(self, spec.name)))

    def with_seed(self, seed: int) -> SamplingSettings:
        """These settings with the seed filled in if it is not pinned (self if it is)."""
        return self if self.seed is not None else self.replace(seed=seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def replace(self, **changes: Any) -> SamplingSettings:
        """A new object with some fields changed (validated like the constructor)."""
        _unknown(changes)
        return dataclasses.replace(self, **changes)

    def diff(self, other: SamplingSettings | None) -> tuple[str, ...]:
        """Names of the fields whose value differs from `other` (all of them if None)."""
        if other is None or other is self:
            return ()
        return tuple(f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingSettings:
        _unknown(data)
        return cls(**data)

    @staticmethod
    def field_names() -> tuple[str, ...]:
        return tuple(SETTING)

    @staticmethod
    def limits(name: str) -> tuple[float, float]:
        """The lowest and highest value `name` may take."""
        return SETTING[name].lo, SETTING[name].hi

    @staticmethod
    def describe(name: str) -> str:
        spec = SETTING[name]
        return f"{name}: {spec.type.__name__} {spec.range_text()} ({spec.hint})"


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
