"""A dialog to set or clear the constraint of the next replies (issue 24): a grammar (GBNF or
Lark) or a JSON schema file, `json` for any JSON object, empty to clear. The file is read
and checked here (llguidance's own check, engine/constraint_grammar.py): a problem is one
line under the field, naming the file and the position, and the dialog stays open."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from loopchat.constraint import Constraint, ConstraintError, read_constraint

HINT = "a .gbnf / .lark grammar or a .json schema file; json: any JSON object; empty: none"


def constraint_from_text(text: str) -> Constraint | None:
    """What the field asks for (None: no constraint); ConstraintError for a file that cannot be used."""
    from loopchat.engine.constraint_grammar import check

    text = text.strip()
    if not text:
        return None
    if text.lower() == "json":
        return Constraint.any_json()
    path = Path(text).expanduser()
    kind = {".json": "json_schema", ".lark": "lark"}.get(path.suffix.lower(), "grammar")
    constraint = read_constraint(kind, path)
    check(constraint)
    return constraint


class ConstraintDialog(ModalScreen[tuple[Constraint | None] | None]):
    """Returns (the new constraint or None to clear it,), or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: Constraint | None) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        now = self.current.source or "json" if self.current is not None else ""
        with Vertical(id="constraint-dialog"):
            yield Static("Constraint of the next replies", id="constraint-title")
            yield Input(now, placeholder="grammar.gbnf, schema.json, json", id="constraint-input", select_on_focus=True)
            yield Static(HINT, id="constraint-hint", markup=False)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()  # Enter applies the dialog; it is not a chat message
        try:
            constraint = constraint_from_text(event.value)
        except ConstraintError as exc:
            self.query_one("#constraint-hint", Static).update(str(exc))
            return
        self.dismiss((constraint,))

    def action_cancel(self) -> None:
        self.dismiss(None)
