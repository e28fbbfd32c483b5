"""The conversation on the left: finished turns stay as finished widgets; only the reply
being generated is updated, by appending the new tokens' text (cost per frame does not
depend on the length of the transcript)."""

from __future__ import annotations

import time

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Markdown, Static

from ..events import FinishReason, Step
from .conversation import BLOCKING, ReplyRecord, finish_label
from .plots import fmt_ms
from .prefs import Prefs

#: (lowest probability, colour) from most to least likely: the probability a token was
#: drawn with, in the distribution after the sampling settings.
PROB_BANDS: tuple[tuple[float, str], ...] = (
    (0.9, "#5fd75f"),
    (0.6, "#afd75f"),
    (0.3, "#ffd75f"),
    (0.1, "#ff8700"),
    (0.0, "#ff5f5f"),
)
_BOUNDARY_BG = ("#2b3340", "#3a4456")
_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def prob_colour(p: float) -> str:
    for lo, colour in PROB_BANDS:
        if p >= lo:
            return colour
    return PROB_BANDS[-1][1]


def legend_text() -> Text:
    t = Text("p when drawn: ", style="dim", no_wrap=True, overflow="ellipsis")
    labels = ("≥90%", "60–90", "30–60", "10–30", "<10%")
    for (_, colour), label in zip(PROB_BANDS, labels):
        t.append("■" + label + " ", style=colour)
    return t


_style_cache: dict[tuple, Style] = {}


def token_style(step: Step, n: int, prefs: Prefs, selected: bool) -> Style | None:
    key = (
        prob_colour(step.sampled_prob) if prefs.prob_colours else None,
        n % 2 if prefs.token_boundaries else None,
        selected,
    )
    style = _style_cache.get(key)
    if style is None:
        colour, parity, sel = key
        style = Style(
            color=colour,
            bgcolor=_BOUNDARY_BG[parity] if parity is not None else None,
        )
        if sel:
            style = Style(color="black", bgcolor="#ffaf00", bold=True)
        _style_cache[key] = style
    return style


class UserMessage(Static):
    def __init__(self, text: str) -> None:
        super().__init__(Text(text), classes="user-message", markup=False)
        self.border_title = "You"


class ReplyView(Vertical):
    """One assistant reply: header, body (text or Markdown), and an info line."""

    def __init__(self, record: ReplyRecord, prefs: Prefs) -> None:
        super().__init__(classes="reply")
        self.record = record
        self.prefs = prefs
        self.selected: int | None = None
        self._text = Text()
        self._n_tokens = 0  # tokens appended to _text (for boundary parity)
        self._markdown: Markdown | None = None
        self._ready = False  # mounted: safe to mount the Markdown view
        self.body = Static(classes="reply-body", markup=False)
        self.info = Static(classes="reply-info", markup=False)
        self.border_title = self._title()

    def _title(self) -> str:
        r = self.record
        title = f"Assistant · reply {r.number}"
        if r.replay_of is not None:
            title += f" · replay of reply {r.replay_of} in {'blocking' if r.mode == BLOCKING else 'streaming'} mode"
        return title

    def compose(self) -> ComposeResult:
        yield self.body
        yield self.info

    def on_mount(self) -> None:
        self._ready = True
        if self.record.done:
            self.finish()
        else:
            self.tick()

    # ---------------------------------------------------------------- live ----
    def add_steps(self, steps: list[Step]) -> None:
        """Streaming: append the new tokens' text (one update per frame)."""
        if self.record.mode == BLOCKING or self.selected is not None:
            return
        for step in steps:
            if step.is_stop or not step.text:
                continue
            self._text.append(step.text, token_style(step, self._n_tokens, self.prefs, False))
            self._n_tokens += 1
        if self.record.shown_at is None and self._n_tokens:
            self.record.shown_at = time.monotonic()
        self.body.update(self._text)

    def tick(self) -> None:
        """Blocking mode (and before the first token): spinner and elapsed time."""
        r = self.record
        if r.done:
            return
        elapsed = time.monotonic() - r.started_at if r.started_at else 0.0
        frame = _SPINNER[int(elapsed * 10) % len(_SPINNER)]
        if r.mode == BLOCKING:
            msg = f"{frame} waiting for the whole reply (blocking mode) · {elapsed:.1f} s"
            self.body.update(Text(msg, style="italic #87afd7"))
        elif self._n_tokens == 0:
            phase = "reading the prompt (prefill)" if r.prefill is None else "first token…"
            self.body.update(Text(f"{frame} {phase} · {elapsed:.1f} s", style="italic #87afd7"))

    # -------------------------------------------------------------- finished ----
    def finish(self) -> None:
        if not self._ready:
            return  # on_mount finishes it
        self.rebuild()
        self.info.update(self.info_text())

    def info_text(self) -> Text:
        r = self.record
        f = r.finish
        if f is None:
            return Text(f"error: {r.error}" if r.error else "", style="#ff5f5f")
        mode = "blocking" if r.mode == BLOCKING else "streamed"
        parts = [mode]
        if r.mode == BLOCKING:
            parts.append(f"whole reply shown after {fmt_ms(f.total_ms)} (model's first token at {fmt_ms(f.ttft_ms)})")
        else:
            if f.completion_tokens:
                parts.append(f"TTFT {fmt_ms(f.ttft_ms)}")
            parts.append(f"total {fmt_ms(f.total_ms)}")
        parts.append(f"{f.completion_tokens} tokens")
        if f.tokens_per_s:
            parts.append(f"{f.tokens_per_s:.0f} tok/s")
        label = finish_label(f)
        style = "dim"
        if f.reason in (FinishReason.CANCELLED, FinishReason.ERROR):
            style = "#ffaf5f"
            label = f"{label} ({f.reason.value})" + (f": {f.error}" if f.error else "")
        parts.append(label)
        return Text(" · ".join(parts), style=style)

    def full_text(self, clickable: bool) -> Text:
        text = Text()
        n = 0
        for step in self.record.steps:
            if step.is_stop or not step.text:
                continue
            style = token_style(step, n, self.prefs, step.index == self.selected)
            if clickable:
                style = (style or Style()) + Style(meta={"token": (self.record.number, step.index)})
            text.append(step.text, style)
            n += 1
        if not self.record.steps and self.record.finish is not None:
            text.append(self.record.finish.text)  # a trace without steps
        if self.record.done:
            text.rstrip()
        self._n_tokens = n
        return text

    def rebuild(self) -> None:
        """Re-render after a preference or the selected token changed."""
        r = self.record
        if not self._ready:
            return
        if not r.done:
            if r.mode != BLOCKING and self.selected is None:
                self._text = self.full_text(clickable=False)
                self.body.update(self._text)
            elif self.selected is not None:
                self.body.update(self.full_text(clickable=False))
            return
        use_md = self.prefs.markdown and self.selected is None and bool(r.text.strip())
        if use_md:
            if self._markdown is None:
                self._markdown = Markdown(r.text, classes="reply-markdown")
                self.mount(self._markdown, before=self.info)
            self._markdown.display = True
            self.body.display = False
        else:
            if self._markdown is not None:
                self._markdown.display = False
            self.body.display = True
            self._text = self.full_text(clickable=True)
            if not self._text.plain and r.finish is not None and r.finish.completion_tokens == 0:
                self._text = Text("(no text)", style="dim italic")
            self.body.update(self._text)

    def on_click(self, event) -> None:
        token = event.style.meta.get("token") if event.style else None
        if token is not None:
            event.stop()
            self.app.action_select_token(*token)

    def select(self, step_index: int | None) -> None:
        if step_index != self.selected:
            self.selected = step_index
            self.rebuild()


class Transcript(VerticalScroll):
    """Scrolls with the reply while anchored; scrolling up releases it (Textual's anchor)."""

    can_focus = True

    def on_mount(self) -> None:
        self.anchor()

    def add_user(self, text: str) -> UserMessage:
        w = UserMessage(text)
        self.mount(w)
        return w

    def add_reply(self, record: ReplyRecord, prefs: Prefs) -> ReplyView:
        w = ReplyView(record, prefs)
        self.mount(w)
        return w

    def add_note(self, text: str, classes: str = "note") -> Static:
        w = Static(Text(text), classes=classes, markup=False)
        self.mount(w)
        return w

    def reply_views(self) -> list[ReplyView]:
        return list(self.query(ReplyView))
