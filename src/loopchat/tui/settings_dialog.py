"""A dialog to type sampling settings, validated field by field (the rows of settings.SETTINGS)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from loopchat.settings import SETTINGS, SamplingSettings, SettingsError
from loopchat.watch import WatchError, parse_watch, watch_line

#: the tokens-on-watch row's hint (watch.py)
WATCH_HINT = 'up to 8 texts followed at every pass of the next replies, e.g. " Paris" " London"'


class SettingsDialog(ModalScreen[SamplingSettings | None]):
    """Returns the new settings, or None when cancelled."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "apply", "Apply", priority=True),
    ]

    def __init__(
        self,
        current: SamplingSettings,
        generating: bool = False,
        live: bool = True,
        stopped: bool = False,
        tokenizer: Any = None,
        watch: tuple[str, ...] | None = None,
    ) -> None:
        """`live`: the backend's replies take a change mid-reply (False: a server's);
        `stopped`: the reply is stopped before a draw in step mode; `tokenizer`: the
        model's (its first_token(text), piece_text(id)), for a logit bias typed as text
        (None: token ids only); `watch`: the tokens on watch (watch.py), a row of their own
        (None: no row: a server's replies have none); once applied, `watch_texts` holds the new ones."""
        super().__init__()
        self.first_token: Callable[[str], int] | None = tokenizer.first_token if tokenizer is not None else None
        self.tokenizer = tokenizer
        self.current = current
        self.generating = generating
        self.live = live
        self.stopped = stopped
        self.watch_texts = watch

    def compose(self) -> ComposeResult:
        with Vertical(id="settings-dialog"):
            yield Static("Sampling settings", id="settings-title")
            if not self.live:  # a server fixed the reply's settings when it was sent
                note = (
                    "The server fixed this reply's settings when it was sent: changes apply to the next reply."
                    if self.generating
                    else "Used from the next reply on (the server fixes a reply's settings when it starts)."
                )
            elif self.stopped:
                note = (
                    "The loop is stopped before a draw (step mode): a change reshapes this draw's die "
                    "at once, from the same logits (no new forward pass)."
                )
            elif self.generating:
                note = "Changes apply at the very next forward pass of the reply being generated."
            else:
                note = "Used from the next reply on (mid-reply: from the next forward pass)."
            yield Static(note, id="settings-note")
            with Grid(id="settings-grid"):
                for spec in SETTINGS:
                    name = spec.name
                    yield Label(spec.label, classes="setting-name")
                    yield Input(
                        self._text(spec, getattr(self.current, name)),
                        id=f"set-{name}",
                        classes="setting-input",
                        compact=True,
                        select_on_focus=True,
                    )
                    yield Static(spec.dialog_hint, id=f"err-{name}", classes="setting-hint", markup=False)
                if self.watch_texts is not None:
                    yield Label("tokens on watch", classes="setting-name")
                    yield Input(watch_line(self.watch_texts), id="set-watch", classes="setting-input", compact=True)
                    yield Static(WATCH_HINT, id="err-watch", classes="setting-hint", markup=False)
            with Horizontal(id="settings-buttons"):
                yield Button("Apply (Enter)", variant="primary", id="apply", compact=True)
                yield Button("Cancel (Esc)", id="cancel", compact=True)

    def _text(self, spec: Any, value: Any) -> str:
        """A field's text: a logit bias's tokens as their texts where the tokenizer gives
        them back ("TEXT"=BIAS), else by id."""
        if spec.kind is None or self.tokenizer is None or self.first_token is None:
            return str(spec.text(value))
        first, piece = self.first_token, self.tokenizer.piece_text

        def as_text(token: int) -> str | None:
            text = piece(token)
            try:
                return text if text and first(text) == token else None
            except ValueError:
                return None

        return str(spec.kind.text(value, as_text))

    def _collect(self) -> tuple[dict[str, Any], bool]:
        values: dict[str, Any] = {}
        ok = True
        for spec in SETTINGS:
            name = spec.name
            raw = self.query_one(f"#set-{name}", Input).value
            err = self.query_one(f"#err-{name}", Static)
            try:
                values[name] = spec.parse(raw, self.first_token)  # type and range checked; an empty seed is None
                err.update(spec.dialog_hint)
                err.remove_class("-error")
            except SettingsError as exc:
                err.update(exc.problem)
                err.add_class("-error")
                ok = False
        if self.watch_texts is not None:
            err = self.query_one("#err-watch", Static)
            try:
                values["watch"] = parse_watch(self.query_one("#set-watch", Input).value)
                err.update(WATCH_HINT)
                err.remove_class("-error")
            except WatchError as exc:
                err.update(str(exc))
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
        watch = values.pop("watch", None)
        try:
            new = self.current.replace(**values)
        except SettingsError as exc:
            self.notify(str(exc), severity="error")
            return
        if watch is not None:
            self.watch_texts = watch
        self.dismiss(new)

    def action_cancel(self) -> None:
        self.dismiss(None)
