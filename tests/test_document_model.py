"""The document view's model without Textual (chat/views/document.py, document_header.py),
on a recorded reply of the default model (tests/data/document.jsonl): the layout of a
record, the cursor's moves between rows, where a step's token is, the short header."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from loopchat.chat.conversation import STREAM, ReplyRecord
from loopchat.chat.views.document import (
    PREFIX,
    REPLY,
    REPLY_MARK,
    DocToken,
    DocumentLines,
    lay_out,
    shown_form,
    status_line,
)
from loopchat.chat.views.document_header import SHORT_VIEW, header_lines, short_header
from loopchat.events import Finish, Prefill, Step
from loopchat.trace import read_trace

DOC_TRACE = Path(__file__).parent / "data" / "document.jsonl"


def record() -> ReplyRecord:
    _, traced = read_trace(DOC_TRACE)
    events = [t.event for t in traced]
    rec = ReplyRecord(1, STREAM, events[0].messages, start=events[0])
    rec.prefill = next(e for e in events if isinstance(e, Prefill))
    rec.steps = [e for e in events if isinstance(e, Step)]
    rec.finish = next(e for e in events if isinstance(e, Finish))
    return rec


def plain(lines) -> str:
    return "\n".join("".join(s for s, _ in line) for line in lines)


def test_a_record_is_laid_out_as_the_prompt_a_marker_and_the_reply() -> None:
    rec = record()
    layout = lay_out(rec, 60)
    doc, start = layout.doc, rec.start
    assert layout.reply_start == len(start.prompt_token_ids) == 35 and not layout.fallback
    assert layout.steps == len(rec.steps)
    reply = "".join(s.text if not s.is_stop else s.piece for s in rec.steps)
    assert doc.shown_text() == shown_form(start.prompt_text + reply)
    (marker,) = doc.markers
    assert doc.rows[marker][0][0] == REPLY_MARK and doc.tokens[layout.reply_start].first_row == marker + 1
    assert [t.position for t in doc.tokens] == list(range(len(doc.tokens)))
    assert all(t.kind == REPLY for t in doc.tokens[35:-1])
    # a step's token, and a live reply's new steps appended to the same rows
    assert layout.step_at(3) == 38 and doc.tokens[38].step is rec.steps[3] and layout.step_at(10_000) is None
    live = dataclasses.replace(rec)
    live.steps = rec.steps[:4]
    grown = lay_out(live, 60)
    live.steps = rec.steps
    grown.add_steps(live)
    assert grown.doc.rows == doc.rows and grown.steps == len(rec.steps)


def test_a_branch_without_its_prefix_steps_shows_the_ids_it_fed() -> None:
    rec = record()
    rec.start = dataclasses.replace(rec.start, reply_prefix=(504, 2122))
    rec.steps = [dataclasses.replace(s, index=s.index + 2) for s in rec.steps]
    layout = lay_out(rec, 60)
    first = layout.doc.tokens[layout.reply_start : layout.reply_start + 2]
    assert [(t.text, t.kind, t.position) for t in first] == [("⟨504⟩", PREFIX, 35), ("⟨2122⟩", PREFIX, 36)]
    assert "(a branch: 2 tokens chosen earlier first)" in plain(layout.doc.line(r, None) for r in layout.doc.markers)


def test_the_cursor_moves_to_the_token_at_its_column_on_the_next_row() -> None:
    doc = DocumentLines(10)
    for i, t in enumerate(["Hugging", " Face", " is", " a", " company", " supercalifragilistic"]):
        doc.add(DocToken(t, i, REPLY, i))
    # rows: "Hugging" / " Face is a" / " company s" / "upercalifr" / "agilistic"
    assert doc.column_of(3) == 8 and doc.column_of(0) == 0
    assert doc.token_toward(0, 1, 1) == 1  # down from "Hugging" (column 0): " Face"
    assert doc.token_toward(3, 2, 1) == 5  # down from " a" (column 8): " supercal…" at column 8
    assert doc.token_toward(5, 5, 1) == 5  # past the end: the last token (it is the cursor's own)
    assert doc.token_toward(4, 1, -1) == 1  # up from " company" (column 0): " Face"
    assert doc.token_toward(1, -1, -1) == 0  # above the first row: the first token
    assert doc.token_toward(None, 1, 1) == 1  # no cursor yet: from column 0
    assert DocumentLines(10).token_toward(None, 0, 1) is None


def test_the_short_header_keeps_the_rows_for_the_text() -> None:
    rec = record()
    assert not short_header(0) and short_header(SHORT_VIEW - 1) and not short_header(SHORT_VIEW)
    full = plain(header_lines(rec, False, 200)).splitlines()
    short = plain(header_lines(rec, False, 200, short=True)).splitlines()
    assert full[0] == "Reply 1 · the text the model reads · Ctrl+T: back to the chat"
    assert full[1].startswith("prompt 35 tokens") and "context policy: nothing dropped" in full
    assert short == [f"Reply 1 as the model reads it (Ctrl+T: back) · {full[1]}"]
    stopped = plain(header_lines(rec, False, 200, stopped=7, short=True)).splitlines()
    assert stopped[1].startswith("step mode: stopped before token 8")


def test_the_status_line_names_the_token_under_the_cursor() -> None:
    rec = record()
    layout = lay_out(rec, 60)
    s = rec.steps[0]
    assert plain([status_line(layout.doc.tokens[35])]) == f"id {s.token_id} · {s.piece!r} · position 35 · reply step 0"
    assert plain([status_line(None)]) == "no token"
