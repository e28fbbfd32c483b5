"""Step mode in the chat (issue 13): the die bar, the token search, and the keys' actions
(a mixin of LoopChatApp).

F12 stops the reply in flight before its next draw (or, between replies, arms step mode:
the next reply stops before its first draw), and lets it run freely again. While the
loop is in step mode the die bar under the transcript has the focus, so the message box
does not take the keys: Enter draws one token, n draws ten, 1–9 pick the candidate of
that rank in the panel's list (raw softmax order: a token the filters cut can be picked
too), / opens a search over the whole vocabulary. Esc and Ctrl+C stop the reply as ever.
The session (session.py) talks to the backend's StepControl; nothing here waits.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from loopchat.chat.plots import fmt_prob, listed_face
from loopchat.chat.session import Refused
from loopchat.events import Candidate

if TYPE_CHECKING:
    from loopchat.tui.app import LoopChatApp

    _Base = LoopChatApp
else:
    _Base = object

#: tokens drawn by the "draw N" key
DRAW_N = 10
#: search results listed at most
SEARCH_ROWS = 12


def step_keys(namespace: str = "app.") -> list[Binding]:
    """The die's keys: the die bar's (the app's actions), and the document view's (its
    own, which act only while the loop is stopped)."""
    return [
        Binding("enter", f"{namespace}step_draw(1)", "Draw", show=False),
        Binding("n", f"{namespace}step_draw({DRAW_N})", f"Draw {DRAW_N}", show=False),
        *(Binding(str(i), f"{namespace}step_pick({i})", f"Pick {i}", show=False) for i in range(1, 10)),
        Binding("slash", f"{namespace}step_search", "Search", show=False),
    ]


class StepBar(Static, can_focus=True):
    """One line above the message box while in step mode; holds the focus while the loop
    is stopped, so digits and Enter reach step mode and not the message box."""

    BINDINGS = step_keys()
    _keys = frozenset(b.key for b in BINDINGS)
    _told = -1e9  # when a typed letter was last answered

    def on_key(self, event: events.Key) -> None:
        """A letter typed while the loop is stopped (the message box does not have the
        focus): say where the keys go rather than drop it silently."""
        if event.key not in self._keys and event.is_printable:
            event.stop()
            now = time.monotonic()
            if now - self._told < 4:  # once for a word typed, not once a letter
                return
            self._told = now
            self.app.notify(
                "The loop is stopped (step mode): typing does not go to the message box. "
                f"Enter draws · n draws {DRAW_N} · 1–9 pick · / search · F12 runs freely · Esc stops",
                timeout=4,
            )

    #: what the bar says, longest first: the first that fits its width is shown
    forms: tuple[str, ...] = ("",)

    def say(self, forms: tuple[str, ...]) -> None:
        self.forms = forms
        self.refresh()

    def render(self) -> str:
        width = self.content_region.width or self.size.width
        return next((f for f in self.forms if cell_len(f) <= width), self.forms[-1])

    DEFAULT_CSS = """
    StepBar {
        height: 1;
        background: #3a3a00;
        color: #ffd75f;
        padding: 0 1;
        display: none;
    }
    StepBar:focus {
        background: #5f5f00;
        text-style: bold;
    }
    """


#: the search's columns: token, id, raw softmax, after sampling (one row a token)
SEARCH_COLUMNS = (16, 6, 11, 14)


def search_prob(p: float) -> str:
    """A probability in the search: as in the panel, and the small ones (any token of
    the vocabulary can be searched) with two significant digits rather than '<0.1%'."""
    return fmt_prob(p) if p >= 0.001 or p <= 0 else f"{p * 100:.2g}%"


def search_row(token: str, tid: str, raw: str, sampled: str) -> Text:
    """One row of the search, its columns aligned (a long token cut with …)."""
    w_tok, w_id, w_raw, w_after = SEARCH_COLUMNS
    if len(token) > w_tok:
        token = token[: w_tok - 1] + "…"
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append(f"{token:<{w_tok}}", "bold")
    line.append(f" {tid:>{w_id}}", "dim")
    line.append(f"  {raw:>{w_raw}}")
    line.append(f"  {sampled:>{w_after}}")
    return line


def listed_faces(
    raw_top: Sequence[Candidate], sampled_top: Sequence[Candidate] | None
) -> dict[int, tuple[float, float | None]]:
    """The die's listed candidates for the search: token id -> (raw, after sampling; None
    for a candidate the sampled list does not hold)."""
    sampled = {c.token_id: c.prob for c in sampled_top or ()}
    return {c.token_id: (c.prob, sampled.get(c.token_id)) for c in raw_top}


class TokenSearch(ModalScreen[int | None]):
    """Pick any token of the vocabulary: type its beginning; Enter picks the highlighted
    one, Esc goes back to the die."""

    BINDINGS = [
        Binding("escape", "cancel", "Back", show=False),
        Binding("down", "move(1)", show=False),
        Binding("up", "move(-1)", show=False),
    ]

    DEFAULT_CSS = """
    TokenSearch { align: center middle; }
    TokenSearch > Vertical {
        width: 64; max-width: 100%; height: auto; max-height: 100%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    TokenSearch OptionList { height: auto; max-height: 16; }
    TokenSearch #search-head { color: $text-muted; }
    TokenSearch #search-cols { color: $text-muted; padding: 0 0 0 2; }
    """

    def __init__(
        self,
        vocabulary: list[str],
        probs,
        listed: dict[int, tuple[float, float | None]],
        *,
        not_sampled: str = "cut",
        note: str = "",
    ) -> None:
        """`probs`: token ids -> [(raw, sampled)] at the pending draw (None: only the
        `listed` candidates' figures are known; the others show "–" raw and `not_sampled`
        after sampling: "cut" when the list held every token sampling kept, else "–")."""
        super().__init__()
        self.vocabulary = vocabulary
        self.probs = probs
        self.listed = listed  # the die's own candidates: searched first
        self.not_sampled = not_sampled
        self.note = note
        self.results: list[int] = []

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Pick any token"
            yield Static(
                "Type the token's beginning (a leading space counts). Enter picks, ↑/↓ move, Esc back."
                + (f" {self.note}" if self.note else ""),
                id="search-head",
            )
            yield Input(placeholder="token text", id="search-input")
            yield Static(search_row("token", "id", "raw softmax", "after sampling"), id="search-cols")
            yield OptionList(id="search-results")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def search(self, query: str) -> list[int]:
        """Token ids whose text is `query` or starts with it (also after a leading
        space): the die's candidates first, then exact matches, then the shortest."""
        if not query:
            return []
        hits = [
            i
            for i, t in enumerate(self.vocabulary)
            if t.startswith(query) or (not query.startswith(" ") and t.startswith(" " + query))
        ]
        hits.sort(
            key=lambda i: (
                i not in self.listed,
                self.vocabulary[i].strip() != query.strip(),
                len(self.vocabulary[i]),
                i,
            )
        )
        return hits[:SEARCH_ROWS]

    def on_input_changed(self, event: Input.Changed) -> None:
        self.results = self.search(event.value)
        probs = self.probs(self.results) if self.results and self.probs is not None else None
        options = self.query_one(OptionList)
        options.clear_options()
        for n, tid in enumerate(self.results):
            raw, sampled = probs[n] if probs else self.listed.get(tid, (None, None))
            row = search_row(
                listed_face(self.vocabulary[tid]),
                str(tid),
                search_prob(raw) if raw is not None else "–",
                search_prob(sampled) if sampled else ("cut" if probs else self.not_sampled),
            )
            options.add_option(Option(row, id=str(tid)))
        if self.results:
            options.highlighted = 0
        elif event.value:
            options.add_option(Option(Text(f"no token starts with {event.value!r}", style="italic"), disabled=True))

    def action_move(self, delta: int) -> None:
        options = self.query_one(OptionList)
        if self.results:
            options.highlighted = max(0, min(len(self.results) - 1, (options.highlighted or 0) + delta))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        options = self.query_one(OptionList)
        if self.results:
            self.dismiss(self.results[options.highlighted or 0])

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id))

    def action_cancel(self) -> None:
        self.dismiss(None)


class StepActions(_Base):
    """The step mode's actions (F12 in keys.BINDINGS; the others are the die bar's)."""

    _step_state: tuple = ()

    @property
    def step_bar(self) -> StepBar:
        return self.query_one(StepBar)

    def action_step_mode(self) -> None:
        try:
            note = self.session.toggle_step()
        except Refused as exc:
            self.notify(str(exc), severity="warning", timeout=4)
            return
        self.notify(note, timeout=2)
        self.sync_step_mode()

    def action_step_draw(self, n: int) -> None:
        try:
            self.session.draw(n)
        except Refused as exc:
            self.notify(str(exc), timeout=2)
        self.sync_step_mode()

    def action_step_pick(self, rank: int) -> None:
        try:
            self.session.pick_rank(rank)
        except Refused as exc:
            self.notify(str(exc), timeout=2)
        self.sync_step_mode()

    def action_step_search(self) -> None:
        s = self.session
        p = s.pending
        if p is None or not s.stopped:
            self.notify("The loop is not stopped: the search picks the token of a stopped draw", timeout=2)
            return
        vocabulary = self.backend.vocabulary()
        if not vocabulary:
            self.notify("This model's vocabulary is not available here", severity="warning")
            return
        listed = listed_faces(p.raw_top, p.sampled_top)

        def done(token: int | None) -> None:
            if token is not None:
                try:
                    s.pick(token)
                except Refused as exc:  # e.g. the reply was stopped meanwhile
                    self.notify(str(exc), timeout=2)
            self.call_after_refresh(self.sync_step_mode)  # after the focus came back from the search

        self.push_screen(TokenSearch(vocabulary, self.backend.pending_probs, listed), done)

    def step_bar_text(self) -> tuple[str, ...]:
        """The die bar's text, longest first (the bar shows the first that fits)."""
        s = self.session
        if s.stopped and s.pending is not None:
            n = s.pending.index + 1
            return (
                f"Step mode · stopped before token {n} · Enter draws · n draws {DRAW_N} · "
                "1–9 pick · / search · F12 runs freely · Esc stops",
                f"Stopped before token {n} · Enter draws · n draws {DRAW_N} · 1–9 pick · / search · F12 runs · Esc stops",
                f"Before token {n} · Enter draw · n ×{DRAW_N} · 1–9 pick · / search · F12 run freely",
                f"Token {n} · Enter · n ×{DRAW_N} · 1–9 · / · F12",
            )
        if s.stepping:
            return ("Step mode · drawing… · F12 runs freely · Esc stops",)
        if s.step_armed:
            return (
                "Step mode armed: the next reply stops before its first draw (F12 disarms)",
                "Step mode armed: the next reply stops first (F12 disarms)",
            )
        return ("",)

    def sync_step_mode(self) -> None:
        """Once a frame: the die bar shown while in step mode (or armed); the focus on it
        when the loop stops, back to the message box when step mode ends."""
        s = self.session
        bar = self.step_bar
        if not s.stepping and bar.has_focus:  # (also when a search closed after the reply ended)
            self.prompt.focus()
        state = (s.stepping or s.step_armed, s.stopped, s.pending)
        if state == self._step_state:
            return
        before = self._step_state or (False, False, None)
        self._step_state = state
        bar.display = state[0]
        bar.say(self.step_bar_text())
        self.document.stopped_before = s.pending.index if state[1] and s.pending is not None else None
        view = self.views.get(s.current) if s.current is not None else None
        if view is not None and view.step_stopped != state[1]:
            view.step_stopped = state[1]  # its "first token…" spinner stops: the loop waits for a key
            view.tick()
        self._panel_dirty = True
        if (
            state[1]
            and not before[1]
            and self.screen is self.screen_stack[0]
            and self.focused is not bar
            and not self.document.body.has_focus  # (the document view takes the die's keys too)
        ):
            bar.focus()
