"""The app's keys: the bindings, and the command palette's entries for them (data: the
app's actions, app.py, do what they say).

Every key here is listed in help_screen.KEYS and docs/keys.md, and pressed by a test.
"""

from __future__ import annotations

from textual.binding import Binding, BindingType

from loopchat.browser import BROWSER_KEYS, web_url
from loopchat.passes import DRAFT_SOURCES


def _keys(key: str) -> str:
    """`key` and its second key; in a browser tab the second first (the footer shows the first)."""
    second = BROWSER_KEYS[key]
    return f"{second},{key}" if web_url() else f"{key},{second}"


#: the footer shows the raise / lower keys as one item
_KNOB_KEYS = Binding.Group("Adjust", compact=True)

BINDINGS: list[BindingType] = [
    # priority: the footer lists these first, and no focused widget takes them
    Binding("f1", "help", "Keys", priority=True),
    Binding("ctrl+q", "quit", "Quit", priority=True),
    Binding("escape", "stop", "Stop"),
    Binding("ctrl+up,alt+up", "knob(1)", "Raise", key_display="^↑", group=_KNOB_KEYS),
    Binding("ctrl+down,alt+down", "knob(-1)", "Lower", key_display="^↓", group=_KNOB_KEYS),
    Binding("f8", "next_knob", "Knob", show=False),
    Binding("f2", "settings", "Settings"),
    Binding("f3", "toggle_streaming", "Mode"),
    Binding(_keys("f5"), "regenerate", "Regenerate"),
    Binding("shift+f5", "replies_n", "N replies", show=False),  # in one batch (batch_keys.py)
    Binding("alt+v", "versions", "Versions side by side", show=False, priority=True),
    Binding("f9", "replay_other_mode", "Other mode", show=False),
    Binding("f10", "toggle_wire", "Wire", show=False),
    Binding(_keys("f11"), "lens", "Logit lens", show=False),  # Alt+L: F11 is many terminals' full screen
    # the document view (document_view.py); Ctrl+T: free in the message box (a TextArea)
    # and in terminals (F11 is often their full screen, Ctrl+E the box's line end)
    Binding(_keys("ctrl+t"), "toggle_document", "Document", priority=True),
    # step mode (step_mode.py); priority: the message box and the search box do not take it
    Binding(_keys("f12"), "step_mode", "Step mode", priority=True),
    Binding(_keys("ctrl+n"), "new_conversation", "New"),
    # completion mode (Ctrl+L: free in the message box, whose Ctrl+E is the line's end)
    Binding("ctrl+l", "toggle_completion", "Completion mode", show=False),
    Binding("ctrl+o", "history", "Conversations", show=False),
    Binding("f4", "toggle_markdown", "Markdown", show=False),
    # priority: the message box (a TextArea) binds F6/F7 to select line / select all
    Binding("f6", "toggle_boundaries", "Token boundaries", show=False, priority=True),
    Binding("f7", "toggle_colours", "Probability colours", show=False, priority=True),
    Binding("shift+f7", "toggle_lens_colours", "Lens depth colours", show=False, priority=True),
    Binding("ctrl+f7", "toggle_forced", "Forced tokens", show=False, priority=True),
    Binding("ctrl+r", "branch", "Branch", show=False),  # (not Ctrl+B: tmux's prefix)
    Binding("alt+pageup", "version(-1)", "Previous version", show=False, priority=True),
    Binding("alt+pagedown", "version(1)", "Next version", show=False, priority=True),
    Binding("alt+left", "token_cursor(-1)", "Previous token", show=False),
    Binding("alt+right", "token_cursor(1)", "Next token", show=False),
    # compare two replies (compare_view.py); Ctrl+G: the message box (a TextArea) binds
    # Ctrl+K, tmux takes Ctrl+B. priority: it closes the compare screen too
    Binding("ctrl+g", "compare", "Compare", show=False, priority=True),
    Binding("ctrl+y", "copy_reply", "Copy reply", show=False, priority=True),  # not TextArea's redo
    # Ctrl+C stops a reply being generated (as in a terminal); otherwise Textual's own
    # hint ("press ctrl+q to quit"). priority: the message box would take it as copy.
    Binding("ctrl+c", "interrupt", "Stop", show=False, priority=True),
]


def draft_entries(draft: str | None) -> list[tuple[str, str, str]]:
    """The palette's Draft entries, one per draft source, the one in force marked ([] when
    the settings have no `draft` row: `draft` None)."""
    if draft is None:
        return []
    return [
        (f"Draft: {source}" + (" (current)" if source == draft else ""), DRAFT_HELP[source], f"set_draft('{source}')")
        for source in DRAFT_SOURCES
    ]


#: what each Draft entry does (speculative decoding, passes.py)
DRAFT_HELP = {
    "off": "The plain loop: one token per forward pass (F2: draft)",
    "lookup": "Speculative: the context's own n-grams propose tokens, one pass checks them all (F2: draft)",
    "model": "Speculative: a draft model proposes tokens, one pass of this model checks them all (F2: draft)",
}


def command_table(
    *, completion: bool, completion_space: bool, history: bool, draft: str | None = None
) -> list[tuple[str, str, str]]:
    """The command palette's entries for the keys: (title, help, the app's action); the
    titles of the toggles say which way they go now; `draft`: the draft in force (None: no
    such setting)."""
    return [
        ("Stream/blocking mode", "Toggle how replies are shown (F3)", "toggle_streaming"),
        ("Markdown", "Render finished replies as Markdown (F4)", "toggle_markdown"),
        ("Token boundaries", "Show where each token starts, then each forward pass (F6)", "toggle_boundaries"),
        ("Probability colours", "Colour tokens by their probability (F7)", "toggle_colours"),
        (
            "Lens depth colours",
            "Colour tokens by the layer from which the logit lens ranks them first (Shift+F7)",
            "toggle_lens_colours",
        ),
        ("Forced tokens", "Mark the tokens a grammar or schema forced: one token allowed (Ctrl+F7)", "toggle_forced"),
        ("Constraint…", "A grammar or JSON schema the next replies follow, or none", "constraint"),
        ("Document view", "The exact text the model reads, token by token ⇄ the chat (Ctrl+T)", "toggle_document"),
        ("Wire view", "The side panel: the loop ⇄ the SSE lines on the wire (F10)", "toggle_wire"),
        ("Logit lens", "What each layer would have said at the pass the panel shows (F11 or Alt+L)", "lens"),
        ("Tokens on watch", "Follow your own tokens' probability and rank at every pass of the next replies", "watch"),
        (
            "Wire view: fold long values",
            "Fold / unfold the loopchat extension and top_logprobs (or click the view)",
            "toggle_wire_fold",
        ),
        (
            "Step mode",
            "Stop the reply before its next draw, or arm the next reply; again: run freely (F12)",
            "step_mode",
        ),
        ("Compare two replies", "Side by side: passes, times, tokens, entropy (Ctrl+G)", "compare"),
        ("Replay last reply in the other mode", "Same seed and settings (F9)", "replay_other_mode"),
        ("Regenerate last reply", "With a new seed (F5)", "regenerate"),
        (
            "4 replies in one batch",
            "The last reply written again 4 times in one batch, as versions (Shift+F5)",
            "replies_n",
        ),
        ("Versions side by side", "The reply's versions pass by pass: where they part (Alt+V)", "versions"),
        ("Copy last reply", "To the clipboard (Ctrl+Y)", "copy_reply"),
        ("New conversation", "Start another conversation (Ctrl+N)", "new_conversation"),
        (
            "Completion mode" + (" → chat mode" if completion else ""),
            "Chat ⇄ a document the model continues, no chat template (Ctrl+L)",
            "toggle_completion",
        ),
        (
            "Completion mode: space before typed text: " + ("on → off" if completion_space else "off → on"),
            "A space before typed text that starts with a letter or digit when the document ends in a non-space",
            "toggle_completion_space",
        ),
        ("Conversations…", "The stored conversations: search, open, rename, delete (Ctrl+O)", "history"),
        (
            "History: " + ("on → off" if history else "off → on"),
            "Keep the conversations, with every step, in the history file",
            "toggle_history",
        ),
        ("Sampling settings…", "Type values (F2)", "settings"),
        *draft_entries(draft),
        (
            "Branch here",
            "A new version of the reply from the selected token: another candidate, or a new draw (Ctrl+R)",
            "branch",
        ),
        ("Previous version of the reply", "Of the last reply's versions (Alt+PgUp)", "version(-1)"),
        ("Next version of the reply", "Of the last reply's versions (Alt+PgDn)", "version(1)"),
    ]
