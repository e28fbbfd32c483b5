"""The document view's prompt surprisal (issue 26, part 2): each prompt token coloured by
how surprising the model found it, its text by what it is (the system prompt, the user's
own words, the template's), the model's top guess under the cursor, and the header's
perplexity and most surprising token.

From the reply's Prefill when it carries prompt logprobs (the chat asks for them while the
document view is open; prompt_read.py computes the figures, docs/trace-format.md defines
them). A reply without them is drawn as before: alternating backgrounds, one colour for
the prompt's text.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.style import Style

from loopchat.chat.conversation import ReplyRecord
from loopchat.events import Candidate, Prefill, Start
from loopchat.prompt_read import SYSTEM, TEMPLATE, USER, summary, surprisals, token_kinds

#: surprisal bins (bits, lower bound) and their two backgrounds (neighbours alternate)
BINS: tuple[tuple[float, tuple[str, str]], ...] = (
    (0.0, ("#1f3a2b", "#2a4a37")),
    (1.0, ("#3a3f1c", "#4a5024")),
    (3.0, ("#5c4214", "#6e501a")),
    (6.0, ("#6e2a14", "#80341b")),
    (10.0, ("#8a1236", "#a01a42")),
)
_NOT_SCORED = ("#303030", "#3c3c3c")  # the first token: nothing before it
_ROLE_FG = {
    SYSTEM: Style(color="#87d7af"),
    USER: Style(color="#ffffff", bold=True),
    TEMPLATE: Style(color="#9e9e9e", italic=True),
}
LABEL = Style.parse("#8a8a8a")
FIGURE = Style.parse("#d0d0d0")
GUESS = Style.parse("bold #87d7ff")


def scored_prompt(start: Start, prefill: Prefill | None) -> list[tuple[float | None, Candidate | None, str]] | None:
    """Each prompt token's (surprisal in bits, the model's top guess at its position, its
    kind: system / user / template); None when the prefill carries no prompt logprobs."""
    bits = surprisals(prefill)
    n = len(start.prompt_token_ids or ())
    if bits is None or prefill is None or len(bits) < n:  # (a cancelled prefill: not all scored)
        return None
    bits = bits[:n]  # (a branch's prefix is scored too: its tokens are the reply's here)
    top = prefill.prompt_top or ()
    kinds = token_kinds(start)
    out = []
    for i, b in enumerate(bits):
        guess = top[i][0] if i < len(top) and top[i] else None
        out.append((b, guess, kinds[i] if i < len(kinds) else TEMPLATE))
    return out


def surprisal_bg(bits: float | None, index: int) -> str:
    if bits is None:
        return _NOT_SCORED[index % 2]
    colours = BINS[0][1]
    for low, pair in BINS:
        if bits >= low:
            colours = pair
    return colours[index % 2]


def surprisal_style(base: Style, role: str, bits: float | None, index: int, control: bool) -> Style:
    """A scored prompt token's style: its role's colour (a control token keeps its own) on
    its surprisal's background."""
    fg = base if control else _ROLE_FG.get(role, base)
    return fg + Style(bgcolor=surprisal_bg(bits, index))


def legend() -> list[tuple[str, Style]]:
    """The header's legend of the colours, when the prompt is scored."""
    parts: list[tuple[str, Style]] = [("surprisal ", LABEL)]
    names = ("<1", "1–3", "3–6", "6–10", "≥10")
    for (_, pair), name in zip(BINS, names):
        parts.append((f" {name} ", Style(color="#ffffff", bgcolor=pair[0])))
    parts.append((" bits · ", LABEL))
    for role, name in ((SYSTEM, "system"), (USER, "user"), (TEMPLATE, "template")):
        parts.append((name, _ROLE_FG[role]))
        parts.append((" ", LABEL))
    return parts


def header_row(rec: ReplyRecord) -> list[tuple[str, Style]] | None:
    """The prompt's perplexity and its most surprising token (None: not scored; the chat
    scores the prompts of the replies sent while the view is open)."""
    start, prefill = rec.start, rec.prefill
    bits = surprisals(prefill)
    s = None if bits is None else summary(bits)
    if start is None or s is None:
        return None
    texts = start.prompt_token_texts
    worst = repr(texts[s.worst]) if s.worst < len(texts) else f"token {s.worst}"
    return [
        (f"prompt perplexity {s.perplexity:,.2f}", FIGURE),
        (f" over {s.scored:,} tokens · most surprising {worst} at {s.worst:,} ({s.worst_bits:.2f} bits)", FIGURE),
    ]


def status_pieces(bits: float | None, guess: Candidate | None, role: str) -> Sequence[tuple[str, Style]]:
    """The cursor line's part for a scored prompt token."""
    out: list[tuple[str, Style]] = [(f" ({role})", LABEL)] if role else []
    if bits is None:
        return [*out, (" · first token: nothing before it to predict it", LABEL)]
    out.append((f" · {bits:.2f} bits (p {2.0**-bits:.3g})", FIGURE))
    if guess is not None:
        out += [(" · the model's guess ", LABEL), (repr(guess.text), GUESS), (f" {guess.prob:.3f}", FIGURE)]
    return out
