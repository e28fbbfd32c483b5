"""Ctrl+G: two finished replies side by side (e.g. one question asked directly and with
"step by step"): their forward passes, times, tokens, mean entropy and surprisal, a
sparkline each of per-pass latency and per-step entropy on one scale, and their texts.

The figures come from reply_stats.py (computed from the records); this module lays them
out. ←/→ move the marked side to the previous / next reply, Tab marks the other side,
↑/↓ PgUp/PgDn scroll, Esc (or Ctrl+G) closes.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from loopchat.chat.conversation import ReplyRecord
from loopchat.chat.plots import fmt_ms, fmt_ms_range, fmt_rate, sparklines_same_scale
from loopchat.chat.replay_check import replay_rows
from loopchat.chat.reply_stats import ReplyStats, ratio, reply_stats
from loopchat.event_lines import NOT_GIVEN

_FINISH = {
    "stop": "end of reply",
    "length": "max_tokens",
    "context": "context full",
    "cancelled": "stopped",
    "error": "error",
}


def _n(v: int | None) -> str:
    return NOT_GIVEN if v is None else f"{v:,}"


def _ms(v: float | None) -> str:
    return NOT_GIVEN if v is None else fmt_ms(v)


def _bits(v: float | None) -> str:
    return NOT_GIVEN if v is None else f"{v:.2f} bits"


def _ratio(a: float | None, b: float | None) -> str:
    r = ratio(a, b)
    return "" if r is None else f"×{r:.2f}"


def _prompt(s: ReplyStats) -> str:
    if s.evaluated_tokens is None:
        return _n(s.prompt_tokens)
    return f"{s.prompt_tokens:,} ({s.evaluated_tokens:,} run, {s.reused_tokens:,} cached)"


def compare_rows(a: ReplyStats, b: ReplyStats) -> list[tuple[str, str, str, str]]:
    """(figure, A, B, B/A) for the table, formatted."""
    rate = lambda v: NOT_GIVEN if v is None else fmt_rate(v)  # noqa: E731
    return [
        ("question", a.question, b.question, ""),
        ("forward passes", _n(a.passes), _n(b.passes), _ratio(a.passes, b.passes)),
        ("prompt tokens", _prompt(a), _prompt(b), _ratio(a.prompt_tokens, b.prompt_tokens)),
        ("prefill", _ms(a.prefill_ms), _ms(b.prefill_ms), _ratio(a.prefill_ms, b.prefill_ms)),
        ("TTFT", _ms(a.ttft_ms), _ms(b.ttft_ms), _ratio(a.ttft_ms, b.ttft_ms)),
        ("decode", _ms(a.decode_ms), _ms(b.decode_ms), _ratio(a.decode_ms, b.decode_ms)),
        ("decode pass, mean", _ms(a.decode_pass_ms), _ms(b.decode_pass_ms), _ratio(a.decode_pass_ms, b.decode_pass_ms)),
        ("tokens", _n(a.tokens), _n(b.tokens), _ratio(a.tokens, b.tokens)),
        ("tokens/s", rate(a.tokens_per_s), rate(b.tokens_per_s), _ratio(a.tokens_per_s, b.tokens_per_s)),
        ("mean entropy", _bits(a.mean_entropy), _bits(b.mean_entropy), _ratio(a.mean_entropy, b.mean_entropy)),
        (
            "mean surprisal",
            _bits(a.mean_surprisal),
            _bits(b.mean_surprisal),
            _ratio(a.mean_surprisal, b.mean_surprisal),
        ),
        ("finish", _FINISH.get(a.finish, a.finish), _FINISH.get(b.finish, b.finish), ""),
    ]


def spark_rows(a: ReplyStats, b: ReplyStats, width: int) -> list[tuple[str, str, str]]:
    """(title, A's line, B's line): per-pass latency and per-step entropy, one scale and
    one count of values per cell for both sides (a line's length shows its count)."""
    out = []
    for title, unit, va, vb in (
        ("latency of each decode pass", "ms", list(a.pass_ms), list(b.pass_ms)),
        ("raw entropy of each step", "bits", list(a.entropies), list(b.entropies)),
    ):
        if not va and not vb:
            out.append((f"{title}: {NOT_GIVEN}", "", ""))
            continue
        both = va + vb
        lo, hi = min(both), max(both)
        scale = fmt_ms_range(lo, hi) if unit == "ms" else f"{lo:.2f}–{hi:.2f} bits"
        la, lb = sparklines_same_scale([va, vb], width)
        out.append((f"{title} (one scale: {scale})", la or NOT_GIVEN, lb or NOT_GIVEN))
    return out


def default_pair(replies: Sequence[ReplyRecord], selected: int | None) -> tuple[int, int]:
    """Indexes (A, B) into `replies`: B the selected reply (a reply number) or the last,
    A the one before it (the next, when B is the first)."""
    b = len(replies) - 1
    for i, rec in enumerate(replies):
        if rec.number == selected:
            b = i
    if b == 0:
        return 0, min(1, len(replies) - 1)
    return b - 1, b


#: The keys, under the screen; the short form where the long one would be cut (80 columns).
KEYS = "←/→ change the marked side's reply · Tab the other side · ↑/↓ scroll · Esc closes"
KEYS_SHORT = "←/→ marked side's reply · Tab other side · ↑/↓ scroll · Esc closes"


class CompareScreen(ModalScreen[None]):
    """Two finished replies side by side."""

    BINDINGS = [
        Binding("escape", "close", "Close", show=False),
        Binding("left", "move(-1)", "Previous reply", show=False, priority=True),
        Binding("right", "move(1)", "Next reply", show=False, priority=True),
        Binding("tab,shift+tab", "switch_side", "Other side", show=False, priority=True),
    ]

    DEFAULT_CSS = """
    CompareScreen {
        align: center middle;
    }
    CompareScreen > VerticalScroll {
        width: 100%;
        height: 100%;
        border: thick $primary;
        border-title-color: $text-primary;
        border-subtitle-color: $text-muted;
        background: $surface;
        padding: 0 1;
    }
    CompareScreen #compare-texts {
        height: auto;
        margin-top: 1;
    }
    CompareScreen .compare-text {
        width: 1fr;
        height: auto;
        padding-right: 2;
    }
    """

    def __init__(self, replies: Sequence[ReplyRecord], a: int, b: int) -> None:
        super().__init__()
        self.replies = list(replies)
        self.sides = [a, b]
        self.side = 1  # the side ←/→ move: B, the reply asked for
        self._stats: dict[int, ReplyStats] = {}

    def stats(self, index: int) -> ReplyStats:
        if index not in self._stats:
            self._stats[index] = reply_stats(self.replies[index])
        return self._stats[index]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="compare-body") as box:
            box.border_title = "Compare two replies"
            box.border_subtitle = KEYS
            yield Static(id="compare-table")
            with Horizontal(id="compare-texts"):
                yield Static(id="compare-text-a", classes="compare-text")
                yield Static(id="compare-text-b", classes="compare-text")

    def on_mount(self) -> None:
        self.redraw()
        self.query_one("#compare-body").focus()

    def on_resize(self) -> None:
        self.redraw()

    def _heading(self, side: int) -> Text:
        s = self.stats(self.sides[side])
        mark = "▸ " if side == self.side else "  "
        return Text(f"{mark}{'AB'[side]} · reply {s.number}", style="bold reverse" if side == self.side else "bold")

    def redraw(self) -> None:
        # the subtitle has the width less the border's corners and a space each side
        self.query_one("#compare-body").border_subtitle = KEYS if len(KEYS) <= self.app.size.width - 6 else KEYS_SHORT
        a, b = self.stats(self.sides[0]), self.stats(self.sides[1])
        table = Table(box=None, padding=(0, 2), expand=True, show_edge=False)
        table.add_column("", style="bold #ffaf00", no_wrap=True)
        table.add_column(self._heading(0), ratio=1, overflow="fold")
        table.add_column(self._heading(1), ratio=1, overflow="fold")
        table.add_column("B/A", no_wrap=True, justify="right")
        for row in compare_rows(a, b) + replay_rows(*(self.replies[i] for i in self.sides)):
            table.add_row(*row)
        width = max(10, self.app.size.width - 10)
        sparks: list[Text] = []
        for title, la, lb in spark_rows(a, b, width):
            sparks.append(Text(title, style="bold #ffaf00"))
            if la or lb:
                sparks.append(Text.assemble(("A ", "bold"), (la, "#5fafff")))
                sparks.append(Text.assemble(("B ", "bold"), (lb, "#5fafff")))
        self.query_one("#compare-table", Static).update(Group(table, Text(""), *sparks))
        for side, s in zip("ab", (a, b)):
            body = Text.assemble(self._heading("ab".index(side)), "\n", (s.text, ""))
            self.query_one(f"#compare-text-{side}", Static).update(body)

    @property
    def text(self) -> str:
        """The screen's content as plain text (for tests)."""
        out = []
        for w in self.query(Static):
            out.append("\n".join(strip.text for strip in w.render_lines(w.size.region)))
        return "\n".join(out)

    def action_move(self, direction: int) -> None:
        """The marked side to the previous / next reply, past the other side's: a reply
        is never compared with itself."""
        i = self.sides[self.side] + direction
        if i == self.sides[1 - self.side]:
            i += direction
        if 0 <= i < len(self.replies):
            self.sides[self.side] = i
            self.redraw()
        else:
            self.app.bell()

    def action_switch_side(self) -> None:
        self.side = 1 - self.side
        self.redraw()

    def action_close(self) -> None:
        self.dismiss(None)
