"""A dialog to type sampling settings, validated field by field (SamplingSettings rules)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from ..settings import OPTIONAL, SamplingSettings, SettingsError

_INT_FIELDS = {"top_k", "repeat_last_n", "seed", "max_tokens"}


def parse_field(name: str, raw: str) -> int | float | None:
    raw = raw.strip()
    if not raw and name in OPTIONAL:
        return None
    if not raw:
        raise SettingsError(f"{name} is empty; {SamplingSettings.describe(name)}")
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{raw!r} is not a number; {SamplingSettings.describe(name)}") from None
    if name in _INT_FIELDS:
        if not value.is_integer():
            raise SettingsError(f"{name} must be a whole number; {SamplingSettings.describe(name)}")
        return int(value)
    return value


HINTS = {
    "temperature": "0–5 · 0 = greedy (always the top token)",
    "top_k": "whole number · 0 = off",
    "top_p": "above 0, up to 1 · 1 = off",
    "min_p": "0–1 · 0 = off",
    "repeat_penalty": "0.1–5 · 1 = off",
    "repeat_last_n": "tokens the penalty looks back over",
    "seed": "empty = random each reply · a number pins it",
    "max_tokens": "most tokens in one reply",
}


def _hint(name: str) -> str:
    return HINTS.get(name) or SamplingSettings.describe(name)


class SettingsDialog(ModalScreen[SamplingSettings | None]):
    """Returns the new settings, or None when cancelled."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "apply", "Apply", priority=True),
    ]

    def __init__(self, current: SamplingSettings, generating: bool = False) -> None:
        super().__init__()
        self.current = current
        self.generating = generating

    def compose(self) -> ComposeResult:
        with Vertical(id="settings-dialog"):
            yield Static("Sampling settings", id="settings-title")
            note = (
                "Changes apply at the very next forward pass of the reply being generated."
                if self.generating
                else "Used from the next reply on (mid-reply: from the next forward pass)."
            )
            yield Static(note, id="settings-note")
            with Grid(id="settings-grid"):
                for name in SamplingSettings.field_names():
                    yield Label(name, classes="setting-name")
                    value = getattr(self.current, name)
                    yield Input(
                        "" if value is None else str(value),
                        id=f"set-{name}",
                        classes="setting-input",
                        compact=True,
                        select_on_focus=True,
                    )
                    yield Static(_hint(name), id=f"err-{name}", classes="setting-hint", markup=False)
            with Horizontal(id="settings-buttons"):
                yield Button("Apply (Enter)", variant="primary", id="apply", compact=True)
                yield Button("Cancel (Esc)", id="cancel", compact=True)

    def _collect(self) -> tuple[dict[str, int | float], bool]:
        values: dict[str, int | float] = {}
        ok = True
        for name in SamplingSettings.field_names():
            raw = self.query_one(f"#set-{name}", Input).value
            err = self.query_one(f"#err-{name}", Static)
            try:
                values[name] = parse_field(name, raw)
                self.current.replace(**{name: values[name]})
                err.update(_hint(name))
                err.remove_class("-error")
            except SettingsError as exc:
                err.update(str(exc).split(";")[0].split(" (")[0].removeprefix(f"{name} "))
                err.add_class("-error")
                ok = False
        return values, ok

    def on_input_changed(self, event: Input.Changed) -> None:
        self._collect()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()  # Enter applies the dialog; it is not a chat message
        self.action_apply()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            self.action_apply()
        else:
            self.dismiss(None)

    def action_apply(self) -> None:
        values, ok = self._collect()
        if not ok:
            self.notify("Fix the highlighted values first", severity="warning")
            return
        try:
            new = self.current.replace(**values)
        except SettingsError as exc:
            self.notify(str(exc), severity="error")
            return
        self.dismiss(new)

    def action_cancel(self) -> None:
        self.dismiss(None)
