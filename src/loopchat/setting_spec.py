"""One sampling setting's row of settings.SETTINGS (its type, range, words and forms),
and the error a bad value raises: the table's vocabulary, apart from the table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


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
    default: int | float | str | tuple[()] | None  # (a tuple or a word: a setting of its own kind)
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
    summary: Callable[[Any], str] | None = None  # (of a SamplingSettings)
    wraps: bool = False  # its summary item goes on a second line when one line is too narrow
    #: a setting of its own kind, not a number (settings_bias): the module with its check, parse, text and wire forms
    kind: Any = None
    #: left out of a trace's settings at its default (a setting of its own kind always is): a
    #: trace that does not use it is as before it existed
    quiet_default: bool = False

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
        if self.kind is not None:
            try:
                self.kind.check(value)
            except ValueError as exc:
                return str(exc)
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

    def check(self, value: Any) -> Any:
        """`value` as this setting's type; SettingsError if it is not allowed."""
        problem = self.problem(value)
        if problem is not None:
            raise SettingsError(f"{self.name} {problem} ({self.hint})", problem)
        if self.kind is not None:
            return self.kind.check(value)
        return value if value is None else self.type(value)

    def parse(self, text: str, first_token: Callable[[str], int] | None = None) -> Any:
        """A typed-in value (the F2 dialog), checked: '' is None for an optional setting.
        `first_token`: the model's tokenizer, for a setting of its own kind that names texts."""
        if self.kind is not None:
            try:
                return self.kind.parse(text, first_token)
            except ValueError as exc:
                raise SettingsError(f"{self.name}: {exc} ({self.hint})", str(exc)) from None
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

    def text(self, value: Any) -> str:
        """The value as the F2 dialog's field holds it ('' for an unpinned seed)."""
        if self.kind is not None:
            return self.kind.text(value)
        return "" if value is None else str(value)

    def wire_form(self, value: Any) -> Any:
        """The value as its request field carries it (the logit bias: OpenAI's {"id": bias})."""
        return self.kind.wire(value) if self.kind is not None else value

    def nudge(self, value: int | float, direction: int) -> int | float:
        """The knob's next value from `value`: one step up (direction 1) or down (-1),
        kept within the knob's range and rounded to what the panel shows."""
        assert self.knob_step is not None, f"{self.name} is not on the knob"
        assert self.decimals is not None  # set by __post_init__
        lo = self.lo if self.knob_lo is None else self.knob_lo
        new = min(self.hi, max(lo, round(value + direction * self.knob_step, max(self.decimals, 2))))
        return self.type(new)
