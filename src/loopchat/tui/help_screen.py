"""F1: the app's own keys, in one table (docs/keys.md's key table lists the same rows; a
test checks that they agree)."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from loopchat.browser import BROWSER_KEYS, shown_key, web_url
from loopchat.settings_text import knob_order_text, knob_steps_text

#: (keys, what they do), in the order docs/keys.md shows them
KEYS: tuple[tuple[str, str], ...] = (
    ("Enter", "Send the message"),
    (
        "Ctrl+J",
        "New line in the message (also Alt+Enter / Shift+Enter, in terminals that tell them from Enter); a pasted block keeps its lines",
    ),
    (
        "PgUp / PgDn, Ctrl+Home / Ctrl+End",
        "Scroll the transcript (or the document view in its place) a page up / down, to its top / end, from the message box; scrolled up, it stops following the reply being written until it is back at the end",
    ),
    (
        "Esc or Ctrl+C",
        "Stop the reply (also during a long prompt prefill: stopped before its first token, the message goes back to the box, out of the conversation and the history); Esc also clears a token selection, then leaves the document view",
    ),
    (
        "Ctrl+↑ / Ctrl+↓ (or Alt+↑ / Alt+↓)",
        f"Raise / lower the selected setting (marked ▸ in the panel): {knob_steps_text()}",
    ),
    ("F8", f"Select the next setting for Ctrl+↑/↓ ({knob_order_text()})"),
    (
        "F2",
        'Sampling settings dialog: type any value (a logit bias as "TEXT"=BIAS; with the model run here, the tokens on watch too), checked as you type; Enter applies',
    ),
    ("F3", "Streaming ⇄ blocking mode for the next replies"),
    (
        "F9",
        "Replay the last reply in the other mode (same messages, seed and settings, and the grammar or JSON schema it followed: same tokens; a replay whose tokens differ, from a server that ignores the seed, says so)",
    ),
    (
        "F10",
        "Wire view ⇄ loop panel: the reply's SSE lines (as loopchat serve would send them, or as the server sent them), chunks/s, bytes/s; a click folds long values",
    ),
    (
        "F12",
        "Step mode: stop the reply before its next draw (between replies: the next reply stops before its first draw); again: run freely",
    ),
    (
        "Enter / n (stopped)",
        "Draw one token / 10 tokens with the current settings (Ctrl+↑/↓ and F2 reshape the die first); these keys and 1–9, / also work in the document view (Ctrl+T)",
    ),
    (
        "1–9 (stopped)",
        "Pick the candidate of that rank in the panel's list (raw order; a token sampling cut too, but not one a grammar or JSON schema forbids there: refused in one line): recorded as picked by hand",
    ),
    (
        "/ (stopped)",
        "Search the whole vocabulary: tokens starting with what you type, with both probabilities; Enter picks",
    ),
    (
        "Ctrl+T",
        "Document view ⇄ transcript: the exact text the model reads for the selected token's reply (or the last): the chat template's control tokens set apart, token boundaries, where the reply begins, the KV cache's reuse, what the context policy dropped; ←/→ ↑/↓ PgUp/PgDn Home/End move a cursor that names each token's id and position. A reply sent while the view is open has its prompt scored: each prompt token on its surprisal's background (bits: <1, 1–3, 3–6, 6–10, ≥10), the system prompt, your words and the template's in three colours, the cursor line gives the token's surprisal and the model's top guess there, the header the prompt's perplexity and most surprising token",
    ),
    (
        "F11",
        "The logit lens of the pass the panel shows (a selected token's, else the last): what each layer would have said, its output through the model's final norm and head; computed for that pass when asked (Esc closes it). Also Alt+L: many terminals keep F11 for full screen",
    ),
    ("F5", "Regenerate the last reply, as a new version of it (a new random seed; a pinned seed moves to the next)"),
    (
        "Shift+F5",
        "Write the last reply again 4 times in one batch (the prompt read once, one forward pass per token of every reply still going): the 4 replies are versions of it (Alt+PgUp/PgDn), reply j drawn with the seed + j; the panel gives each batched pass its cost against one sequence's, measured in the same run",
    ),
    (
        "Alt+V",
        "The versions of the selected token's reply (else of the last) side by side, pass by pass: each one's token and the probability it was drawn with, from a few passes before they part; at the pass where they part, what each drew, with both probabilities; with flash attention off, that a batched pass's probabilities can differ from one sequence's by a few hundredths (Esc closes)",
    ),
    (
        "Ctrl+R",
        "Branch the reply at the selected token (Alt+←/→ or a click): that pass's candidates with both probabilities; pick another (1–9, Enter; / searches the whole vocabulary) or draw again (0): a new version keeps the tokens before it and reuses the KV cache",
    ),
    (
        "Alt+PgUp / Alt+PgDn",
        'Previous / next version of the selected token\'s reply, else of the last reply (F5 and Ctrl+R make them: "version 2/3" in its title); the conversation goes on from the one shown, with the later turns built on it',
    ),
    ("Ctrl+N", "New conversation"),
    (
        "Ctrl+L",
        "Completion mode ⇄ chat mode: write a document and the model continues it, no chat template (Enter appends the box's text and continues; an empty Enter: more); a conversation under way is left for a new one",
    ),
    (
        "Ctrl+O",
        "Conversations: the stored ones, newest first, with a search box; Enter opens one to continue it, Ctrl+R renames, Ctrl+D deletes",
    ),
    ("Ctrl+Y", "Copy the last reply to the clipboard"),
    (
        "Ctrl+G",
        "Compare two finished replies side by side (the selected token's reply, or the last, and the one before it): forward passes, prefill and decode time, tokens, mean entropy and surprisal, per-pass latency and entropy sparklines on one scale, the texts; ←/→ change the marked side's reply, Tab marks the other side, Esc closes",
    ),
    (
        "Alt+← / Alt+→",
        "Token cursor: step through the tokens of past replies (or click a token; what you type next still goes to the message box, as it does in the document view)",
    ),
    ("F4", "Finished replies as Markdown ⇄ plain tokens"),
    (
        "F6",
        "Token boundaries: off → by token (alternating backgrounds) → by forward pass (one shade per pass: under a draft, the tokens one verifying pass gave share it, and the drafted tokens it kept are on green) → off",
    ),
    ("F7", "Colour each token by the probability it was drawn with (legend on top)"),
    (
        "Shift+F7",
        "Colour each token by its lens depth: the first layer from which on the logit lens ranks it first (early: the model knew it from the first layers; the last: it decided late; grey: not its top even at the last layer). The shown reply's passes are read with the lens when turned on, then each new reply's once it ends (legend on top, with the progress; a message sent meanwhile goes first)",
    ),
    (
        "Ctrl+F7",
        "Mark the tokens a grammar or JSON schema forced (blue italics: the only token the constraint allowed at their pass; the palette's Constraint… sets a grammar or schema file for the next replies, `json` any JSON object, empty none)",
    ),
    ("Ctrl+P", "Command palette: switch model, every toggle above"),
    ("F1", "Show / hide this list of keys"),
    ("Ctrl+Q", "Quit (with a draft in the message box it says so first: Ctrl+Q again quits)"),
)


#: F1's "In a browser" column (a tab of `loopchat web`): the key that works there where the
#: browser keeps the row's key for itself, and what a browser changes (docs/keys.md: the
#: table's third column)
IN_A_BROWSER: dict[str, str] = {
    **{shown_key(key): shown_key(second) for key, second in BROWSER_KEYS.items()},
    "Ctrl+Y": "Ctrl+Y (https:// or this machine's pages)",
}


def keys_table(browser: bool) -> Table:
    """The keys; `browser` (a tab of `loopchat web`): with the "In a browser" column (in a
    terminal it would take a sixth of an 80-column screen for six rows)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold #ffaf00", no_wrap=True)
    table.add_column()
    if browser:
        table.add_column(style="#ffaf00", max_width=14)
        table.add_row("", "", "In a browser")
    for keys, what in KEYS:
        table.add_row(keys, what, *([IN_A_BROWSER.get(keys, "")] if browser else []))
    return table


class HelpScreen(ModalScreen[None]):
    """The app's keys; F1, Esc or q closes it."""

    BINDINGS = [
        Binding("f1,escape,q", "dismiss_help", "Close", show=False),
    ]

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > VerticalScroll {
        width: 112;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        border: thick $primary;
        border-title-color: $text-primary;
        background: $surface;
        padding: 0 1;
    }
    HelpScreen #help-foot {
        color: $text-muted;
        margin-top: 1;
    }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = "loopchat keys"
            browser = web_url() is not None
            yield Static(keys_table(browser), id="help-keys")
            yield Static(
                "In the message box the usual editing keys work too (Ctrl+A/E line start/end, "
                "Ctrl+W or Alt+Backspace delete word, Ctrl+Z undo…). In a browser (loopchat web) the "
                "browser keeps Ctrl+T, Ctrl+N, Ctrl+W, F5, F11 and F12 for itself: "
                + ("the last column gives the key that works there" if browser else "F1 there gives the key that works")
                + ". F1 or Esc closes this list.",
                id="help-foot",
            )

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
