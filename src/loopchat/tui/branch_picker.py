"""Ctrl+R: branch a reply at the selected token (issue 13).

The dialog shows the die of that pass as it was rolled: its candidates, raw softmax and
after sampling (the settings of that pass), the token drawn marked ▶. The user picks
another face (a candidate: the new version of the reply takes it at that step, recorded
as picked by hand; / searches the whole vocabulary) or rolls again with the current
settings (row 0). The reply up to that token stays; the engine reuses the KV cache up
to there.

`branch_choices` is the list without Textual, for the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from loopchat.chat.plots import fmt_prob, listed_face, token_face
from loopchat.events import Step
from loopchat.settings import SamplingSettings
from loopchat.settings_text import knobs_line
from loopchat.tui.step_mode import TokenSearch, listed_faces


@dataclass(frozen=True)
class BranchChoice:
    """What the new version takes at the branch point: a token, or a new draw (None)."""

    token_id: int | None
    label: str


def settings_line(s: SamplingSettings) -> str:
    return knobs_line(s)  # "T 0.70, top-p 0.95, top-k 40, min-p 0.05": the knobs (settings.SETTINGS)


def sampled_complete(step: Step) -> bool:
    """Whether the step's stored after-sampling list holds every token sampling kept (a
    token missing from it was then cut; else its probability is not known)."""
    return (
        step.candidates_kept is not None
        and step.sampled_top is not None
        and (step.candidates_kept <= len(step.sampled_top))
    )


def branch_choices(step: Step, current: SamplingSettings) -> list[tuple[BranchChoice, str]]:
    """(choice, row text): row 0 draws again with `current`; then the pass's candidates
    in raw softmax order with both probabilities (the settings of that pass cut a row
    whose sampled probability is shown as "cut")."""
    rows: list[tuple[BranchChoice, str]] = [
        (BranchChoice(None, "a new draw"), f"0     ↻ roll again: {settings_line(current)}"),
    ]
    sampled = {c.token_id: c.prob for c in step.sampled_top or ()}
    complete = sampled_complete(step)
    for i, c in enumerate(step.raw_top):
        sp = sampled.get(c.token_id)
        after = fmt_prob(sp) if sp is not None else ("cut" if complete else "–")
        drawn = c.token_id == step.token_id
        key = f"{i + 1:<2}" if i < 9 else "- "  # (no digit: Enter picks it; the list drops leading spaces)
        rows.append(
            (
                BranchChoice(c.token_id, token_face(c.text, c.piece_bytes)),
                f"{key}  {'▶' if drawn else ' '} {token_face(c.text, c.piece_bytes)[:14]:<14} raw {fmt_prob(c.prob):>6} · "
                f"after sampling {after:>6}" + ("  (drawn)" if drawn else ""),
            )
        )
    return rows


class BranchPicker(ModalScreen[BranchChoice | None]):
    """Dismissed with the choice, or None (Esc)."""

    DEFAULT_CSS = """
    BranchPicker { align: center middle; }
    BranchPicker > Vertical {
        width: 90; max-width: 96%; height: auto; max-height: 90%;
        border: round $accent; background: $panel; padding: 0 1;
    }
    BranchPicker #branch-title { text-style: bold; }
    BranchPicker #branch-help { color: $text-muted; }
    BranchPicker OptionList { height: auto; max-height: 16; }
    """
    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        *[Binding(str(d), f"pick({d})", show=False) for d in range(10)],
        Binding("slash", "search", "Any token", show=False),
    ]

    def __init__(self, reply: int, step: Step, current: SamplingSettings, vocabulary: list[str] | None = None) -> None:
        """`vocabulary`: every token's text by id, for the search (None: no search)."""
        super().__init__()
        self.reply = reply
        self.step = step
        self.rows = branch_choices(step, current)
        self.vocabulary = vocabulary

    def compose(self) -> ComposeResult:
        s = self.step
        with Vertical():
            yield Static(
                f"Branch reply {self.reply} at token {s.index + 1} (drawn: {token_face(s.piece, s.piece_bytes)!s})",
                id="branch-title",
            )
            yield Static(
                Text(
                    "A new version of the reply keeps the tokens before this one and takes what you pick here "
                    "(recorded as picked by hand), then runs on with the current settings. "
                    "Enter or 0–9 picks (0: roll again with the current settings) · "
                    + ("/ searches every token · " if self.vocabulary else "")
                    + "Esc cancels · Alt+PgUp / Alt+PgDn switch versions afterwards"
                ),
                id="branch-help",
            )
            yield OptionList(*[Option(text) for _, text in self.rows], id="branch-options")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        options.highlighted = 0
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(self.rows[event.option_index][0])

    def action_pick(self, n: int) -> None:
        if n < len(self.rows):
            self.dismiss(self.rows[n][0])

    def action_search(self) -> None:
        """Any token of the vocabulary; the pass's stored candidates give its figures."""
        vocabulary = self.vocabulary
        if not vocabulary:
            self.notify("This model's vocabulary is not available here", severity="warning")
            return
        s = self.step

        def done(token: int | None) -> None:
            if token is not None:
                self.dismiss(BranchChoice(token, listed_face(vocabulary[token])))

        self.app.push_screen(
            TokenSearch(
                vocabulary,
                None,
                listed_faces(s.raw_top, s.sampled_top),
                not_sampled="cut" if sampled_complete(s) else "–",
                note=f"Figures: the {len(s.raw_top)} candidates stored for this pass; – not stored.",
            ),
            done,
        )

    def action_cancel(self) -> None:
        self.dismiss(None)


__all__ = ["BranchChoice", "BranchPicker", "branch_choices"]
