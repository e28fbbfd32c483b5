"""The document view's header: the reply's prompt and KV-cache figures, the step-mode
stop, what the context policy dropped, and a legend of the token colours. A view of few
rows (80x24: the panel under it) keeps them for the text: the title and the figures on
one row, no "nothing dropped" and no legend."""

from __future__ import annotations

from loopchat.browser import key_here
from loopchat.chat.conversation import ReplyRecord
from loopchat.chat.plots import fmt_ms
from loopchat.chat.views.document import CONTROL, HEAD, LABEL, NOTE, PROMPT, REPLY, STATUS, token_style
from loopchat.chat.views.document_surprisal import header_row, legend
from loopchat.chat.views.figure_rows import figure_rows
from loopchat.chat.views.lines import Line, Pieces

#: a view of fewer rows than this (80x24: the panel under it) has the short header
SHORT_VIEW = 16


def short_header(view_height: int) -> bool:
    """Whether a view `view_height` rows high has the short header (0: not laid out yet)."""
    return 0 < view_height < SHORT_VIEW


def _figures(rec: ReplyRecord, parts: Pieces) -> Pieces:
    """The prompt's size, the prefill's KV-cache figures and the reply's size, on one row."""
    start = rec.start
    assert start is not None
    if start.prompt_token_ids is None:
        parts.append(("prompt: not given by the server", LABEL))
    else:
        control = len(start.prompt_special)
        parts.append(
            (f"prompt {len(start.prompt_token_ids):,} tokens" + (f" ({control} control)" if control else ""), STATUS)
        )
    p, f = rec.prefill, rec.finish
    if p is not None:
        parts.append((f" · KV cache: {p.reused_tokens:,} reused, {p.evaluated_tokens:,} evaluated", STATUS))
    elif not rec.done:
        parts.append((" · prefill running…", NOTE))
    elif f is not None and f.prefill_ms is not None:  # a server's own (llama.cpp's timings), as the panel shows it
        parts.append((f" · prefill {fmt_ms(f.prefill_ms)} (the server's timing)", STATUS))
    else:
        parts.append((" · prefill: not recorded", LABEL))
    n_reply = sum(1 for s in rec.steps if not s.is_stop)
    parts.append((f" · reply {n_reply:,} tokens" + ("" if rec.done else " so far"), STATUS))
    return parts


def _notes(rec: ReplyRecord, fallback: bool, stopped: int | None, short: bool) -> list[Pieces]:
    """The rows under the figures: the step-mode stop, the context policy, an older trace
    or a server that did not send its prompt, the legend."""
    rows: list[Pieces] = []
    if stopped is not None:
        rows.append([(f"step mode: stopped before token {stopped + 1}, drawn at the end of this text (Enter)", NOTE)])
    t = rec.trimmed
    if t is not None:
        dropped = (
            f"context policy ({t.policy}): {t.dropped_messages} message(s) dropped, "
            f"{t.prompt_tokens_before:,} → {t.prompt_tokens_after:,} tokens (n_ctx {t.n_ctx:,})"
        )
        rows.append([(dropped, NOTE)])
    elif not short:
        rows.append([("context policy: nothing dropped", LABEL)])
    if fallback:
        older = (
            "an older trace: no per-token texts recorded, so the prompt is its text, without token boundaries or ids"
        )
        rows.append([(older, NOTE)])
    elif rec.start is not None and rec.start.prompt_token_ids is None:
        rows.append([("the server did not send the prompt it built: only the reply's tokens are shown", NOTE)])
    read = header_row(rec)
    if read is not None and not short:
        rows.append(read)
    if not short and rec.prefill is not None and rec.prefill.prompt_logprobs is not None:
        rows.append([*legend(), (" · cursor: ←/→ ↑/↓ PgUp/PgDn Home/End", LABEL)])
    elif not short:
        rows.append(
            [
                ("control", token_style(CONTROL, 0)),
                (" ", LABEL),
                ("prompt", token_style(PROMPT, 1)),
                (" ", LABEL),
                ("reply", token_style(REPLY, 0)),
                (" · cursor: ←/→ ↑/↓ PgUp/PgDn Home/End", LABEL),
            ]
        )
    return rows


def header_lines(
    rec: ReplyRecord | None,
    fallback: bool,
    width: int,
    stopped: int | None = None,
    short: bool = False,
) -> list[Line]:
    """The view's header at `width`; `stopped`: the step the live reply's loop is stopped
    before; `short`: a view of few rows (see the module's docstring)."""
    rows: list[Pieces] = []
    back = key_here("ctrl+t")  # (Alt+T in a browser tab)
    if rec is None:
        rows.append(
            [("The text the model reads", HEAD), (f" · no reply yet: send a message ({back}: back to the chat)", LABEL)]
        )
    elif short:
        rows.append([(f"Reply {rec.number} as the model reads it", HEAD), (f" ({back}: back) · ", LABEL)])
    else:
        rows.append([(f"Reply {rec.number} · the text the model reads", HEAD), (f" · {back}: back to the chat", LABEL)])
    if rec is not None and rec.start is None:
        rows.append([("waiting for the prompt…", NOTE)])
    elif rec is not None:
        figures = _figures(rec, rows.pop() if short else [])
        rows += [figures, *_notes(rec, fallback, stopped, short)]
    return [r for p in rows for r in figure_rows(p, width)]
