"""Step mode in the chat (issue 13): the die bar and the token search.

F12 stops the reply in flight before its next draw (or, between replies, arms step mode:
the next reply stops before its first draw), and lets it run freely again. While the
loop is in step mode the die bar under the transcript has the focus, so the message box
does not take the keys: Enter draws one token, n draws ten, 1–9 pick the candidate of
that rank in the panel's list (raw softmax order: a token the filters cut can be picked
too), / opens a search over the whole vocabulary. Esc and Ctrl+C stop the reply as ever.
The bar posts what its keys ask for (StepBar.StepRequested, TokenPicked, SearchRequested);
the app passes it to the session (session.py), which talks to the backend's StepControl;
nothing here waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from loopchat.browser import key_here
from loopchat.chat.plots import fmt_prob, listed_face
from loopchat.chat.session import ChatSession
from loopchat.events import Candidate

#: tokens drawn by the "draw N" key
DRAW_N = 10
#: search results listed at most
SEARCH_ROWS = 12


def step_keys(namespace: str = "") -> list[Binding]:
    """The die's keys: the die bar's and the document view's (their own actions; the
    document view's act only while the loop is stopped)."""
    return [
        Binding("enter", f"{namespace}step_draw(1)", "Draw", show=False),
        Binding("n", f"{namespace}step_draw({DRAW_N})", f"Draw {DRAW_N}", show=False),
        *(Binding(str(i), f"{namespace}step_pick({i})", f"Pick {i}", show=False) for i in range(1, 10)),
        Binding("slash", f"{namespace}step_search", "Search", show=False),
    ]


class StepBar(Static, can_focus=True):
    """One line above the message box while in step mode; holds the focus while the loop
    is stopped, so digits and Enter reach step mode and not the message box."""

    BINDINGS: ClassVar[list[BindingType]] = [*step_keys()]
    _keys = frozenset(b.key for b in step_keys())
    _told = -1e9  # when a typed letter was last answered
    _state: tuple = ()  # what the bar last showed: (shown, stopped, the pending die)

    class StepRequested(Message):
        """Draw `n` tokens (Enter: 1, n: DRAW_N) with the current settings."""

        def __init__(self, n: int) -> None:
            super().__init__()
            self.n = n

    class TokenPicked(Message):
        """The pending draw takes the candidate listed at `rank` (1–9)."""

        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank

    class SearchRequested(Message):
        """/: pick any token of the vocabulary (the app opens the search)."""

    def action_step_draw(self, n: int) -> None:
        self.post_message(self.StepRequested(n))

    def action_step_pick(self, rank: int) -> None:
        self.post_message(self.TokenPicked(rank))

    def action_step_search(self) -> None:
        self.post_message(self.SearchRequested())

    def sync(self, s: ChatSession) -> tuple[bool, bool] | None:
        """Show the session's step mode: the bar while in step mode (or armed), saying
        what the keys do. None: nothing changed; else (stopped now, stopped before)."""
        state = (s.stepping or s.step_armed, s.stopped, s.pending)
        if state == self._state:
            return None
        before = self._state or (False, False, None)
        self._state = state
        self.display = state[0]
        self.say(bar_forms(s))
        return state[1], before[1]

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
                f"Enter draws · n draws {DRAW_N} · 1–9 pick · / search · {key_here('f12')} runs freely · Esc stops",
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
    return {c.token_id: (c.prob, sampled.get(c.token_id)) for c in raw_top if c.token_id is not None}


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
        probs: Callable[[Sequence[int]], list[tuple[float, float]] | None] | None,
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
        if event.option.id is not None:  # every option is made with its token id
            self.dismiss(int(event.option.id))

    def action_cancel(self) -> None:
        self.dismiss(None)


def bar_forms(s: ChatSession) -> tuple[str, ...]:
    """The die bar's text, longest first (the bar shows the first that fits)."""
    f12 = key_here("f12")  # (Alt+S in a browser tab)
    if s.stopped and s.pending is not None:
        n = s.pending.index + 1
        return (
            f"Step mode · stopped before token {n} · Enter draws · n draws {DRAW_N} · "
            f"1–9 pick · / search · {f12} runs freely · Esc stops",
            f"Stopped before token {n} · Enter draws · n draws {DRAW_N} · 1–9 pick · / search · {f12} runs · Esc stops",
            f"Before token {n} · Enter draw · n ×{DRAW_N} · 1–9 pick · / search · {f12} run freely",
            f"Token {n} · Enter · n ×{DRAW_N} · 1–9 · / · {f12}",
        )
    if s.stepping:
        return (f"Step mode · drawing… · {f12} runs freely · Esc stops",)
    if s.step_armed:
        return (
            f"Step mode armed: the next reply stops before its first draw ({f12} disarms)",
            f"Step mode armed: the next reply stops first ({f12} disarms)",
        )
    return ("",)
