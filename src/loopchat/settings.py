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

from loopchat.setting_spec import SettingsError as SettingsError
from loopchat.setting_spec import SettingSpec as SettingSpec
from loopchat.setting_spec import fmt_limit as fmt_limit
from loopchat.settings_bias import HINT as BIAS_HINT
from loopchat.settings_bias import KIND as BIAS
from loopchat.settings_draft import DRAFT_MAX
from loopchat.settings_draft import HINT as DRAFT_HINT
from loopchat.settings_draft import KIND as DRAFT

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
        "frequency_penalty",
        float,
        0.0,
        -2.0,
        2.0,
        "OpenAI's frequency penalty, as llama.cpp applies it: a token the last repeat_last_n tokens hold n times "
        "loses n * frequency_penalty (+ presence_penalty) from its logit; 0 disables it",
        "-2–2 · 0 = off · per repeat in last_n",
        short="freq",
        label="freq_penalty",
        openai=True,
        quiet_default=True,
        summary=lambda s: fmt_counted(s),
        wraps=True,
    ),
    SettingSpec(
        "presence_penalty",
        float,
        0.0,
        -2.0,
        2.0,
        "OpenAI's presence penalty, as llama.cpp applies it: a token the last repeat_last_n tokens hold at all "
        "loses presence_penalty from its logit; 0 disables it",
        "-2–2 · 0 = off · once if in last_n",
        short="pres",
        label="pres_penalty",
        openai=True,
        quiet_default=True,
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
    SettingSpec(
        "logit_bias",
        tuple,
        (),
        -100,
        100,
        BIAS_HINT,
        '"TEXT"=BIAS, ID=BIAS, … · -100 bans',
        short="bias",
        openai=True,
        summary=lambda s: BIAS.summary(s.logit_bias),
        wraps=True,
        kind=BIAS,
    ),
    SettingSpec(
        "draft",
        str,
        "off",
        0,
        0,
        DRAFT_HINT,
        "off · lookup · model (speculative)",
        short="draft",
        summary=lambda s: DRAFT.summary(s.draft, s.draft_max),
        wraps=True,
        kind=DRAFT,
    ),
    SettingSpec(
        "draft_max",
        int,
        DRAFT_MAX,
        1,
        64,
        "the most tokens drafted for one verifying pass (fewer when drafts keep failing)",
        "tokens drafted per pass, at most",
        short="draft_max",
        quiet_default=True,
    ),
)

#: name -> its row
SETTING: dict[str, SettingSpec] = {s.name: s for s in SETTINGS}

#: The settings Ctrl+Up/Down change (F8 goes through them in this order).
KNOBS: tuple[str, ...] = tuple(s.name for s in SETTINGS if s.knob_step is not None)


def fmt_value(name: str, value: int | float | None) -> str:
    """A setting's value as the panel shows it: 'random' for an unpinned seed, whole
    numbers plain, other numbers with the row's decimals (0.70)."""
    spec = SETTING[name]
    if spec.kind is not None:
        return spec.kind.text(value) or "none"
    if value is None:
        return "random"
    if spec.type is int:
        return str(int(value))
    return f"{value:.{spec.decimals}f}"


#: The settings sent to a remote server beyond OpenAI's own (llama-server's names)
EXTENSION_KEYS: tuple[str, ...] = tuple(s.wire for s in SETTINGS if not s.openai)


def wire_values(settings: SamplingSettings, extensions: bool = True) -> dict[str, Any]:
    """The request fields that carry `settings` to a server, by their wire names: OpenAI's
    own, and the extensions too when `extensions` (an unpinned seed is left out, and a
    quiet setting at its default: a server that knows nothing of drafts is not told of one)."""
    return {
        spec.wire: spec.wire_form(value)
        for spec in SETTINGS
        if (spec.openai or extensions)
        and (value := getattr(settings, spec.name)) not in (None, ())
        and (value != spec.default or (spec.kind is None and not spec.quiet_default))
    }


def fmt_counted(s: SamplingSettings) -> str:
    """The panel's item for the frequency and presence penalties: 'freq 0.50 pres 0.60 over 64', or ''
    when both are 0."""
    if s.frequency_penalty == 0.0 and s.presence_penalty == 0.0:
        return ""
    return f"freq {s.frequency_penalty:.2f} pres {s.presence_penalty:.2f} over {s.repeat_last_n}"


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
        """Every field; a setting of its own kind only when set (a trace without a bias or a draft is as before)."""
        return {
            s.name: v
            for s in SETTINGS
            if (v := getattr(self, s.name)) != s.default or (s.kind is None and not s.quiet_default)
        }

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
