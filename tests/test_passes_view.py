"""How the chat shows speculative passes (issue 25, "Shown"), as pure view models: the
panel's pass rows and the token's role, the refused drafts, the reply's tokens per pass
and acceptance rate, the document view's status line and the wire view's step notes.

The input is the recorded real reply with its steps grouped into verifying passes
(spec_reply.py); every figure checked here is recomputed from the steps' own fields.
"""

from __future__ import annotations

import json

from panel_ladder_cases import reply
from spec_reply import DRAFT_MS, LAYOUT, PASS_MS, speculative_steps

from loopchat.chat.pass_stats import forward_pass, pass_of_token, pass_row, pass_steps, reply_part, role, tally
from loopchat.chat.plots import fmt_prob
from loopchat.chat.views.document import lay_out, status_line
from loopchat.chat.views.panel import panel_lines
from loopchat.chat.views.panel_passes import pass_lines, pass_short
from loopchat.chat.views.panel_view import PanelView
from loopchat.chat.wire_feed import ReplyWire
from loopchat.passes import PassReport


def _spec_reply():
    r = reply()
    r.steps = speculative_steps(r.steps)
    return r


def _text(lines) -> str:
    return "\n".join("".join(t for t, _ in line) for line in lines)


def test_the_pass_row_says_what_the_pass_checked_kept_and_took() -> None:
    assert pass_row(PassReport(36, 5, 3, True, "lookup", 14.2, 0.3)) == (
        "pass 37 · checked 5 drafted tokens · kept 3 + 1 drawn · 14.2 ms"
    )
    # (shown from 1, the prefill's pass, as the panel's title counts forward passes: number + 1)
    # the reply ended inside the pass (no token of its own); one draft; nothing drafted
    assert (
        pass_row(PassReport(8, 4, 2, False, "model", 9.25, 1.0))
        == "pass 9 · checked 4 drafted tokens · kept 2 · 9.2 ms"
    )
    assert (
        pass_row(PassReport(3, 1, 1, True, "lookup", 8.0, 0.1))
        == "pass 4 · checked 1 drafted token · kept 1 + 1 drawn · 8.0 ms"
    )
    assert (
        pass_row(PassReport(4, 0, 0, True, "lookup", 8.7, 0.2))
        == "pass 5 · no drafted tokens to check · 1 drawn · 8.7 ms"
    )


def test_each_token_says_its_role_in_its_pass_and_the_pass_lists_its_refused_draft() -> None:
    steps = _spec_reply().steps
    # pass 1 gave steps 1-4: three drafts kept, then a draw that refused the 4th draft
    assert [role(s) for s in steps[1:4]] == ["drafted, kept"] * 3
    refused = steps[4].rejected
    assert refused is not None and refused.token_id != steps[4].token_id
    # the refused draft's probabilities are the step's own for that token, raw and after sampling
    raw = {c.token_id: c.prob for c in steps[4].raw_top}
    sampled = {c.token_id: c.prob for c in steps[4].sampled_top or ()}
    assert refused.raw_prob == raw[refused.token_id] and refused.sampled_prob == sampled[refused.token_id]
    assert role(steps[4]) == (
        f"drawn by the pass after the draft's ␣{refused.text.strip()} ({fmt_prob(refused.raw_prob)} raw) was refused"
    )
    assert role(steps[10]) == "drawn by the pass after all 4 drafted tokens were kept"  # pass 3: (4, 4, True)
    assert pass_steps(steps, steps[2]) == steps[1:5] and pass_steps(steps, steps[5]) == [steps[5]]
    # a kept token's rows: the pass row, the draft's source and time, its role, the refused draft
    text = _text(pass_lines(steps[2], steps, 200))
    assert text.splitlines() == [
        f"pass 2 · checked 5 drafted tokens · kept 3 + 1 drawn · {PASS_MS[0]} ms",
        "this token: drafted, kept",
        f"refused at token 5: ␣{refused.text.strip()} · raw {fmt_prob(refused.raw_prob)} · "
        f"after sampling {fmt_prob(refused.sampled_prob)}",
        f"drafted by prompt lookup in {DRAFT_MS:.1f} ms · this pass gave tokens 2–5",
    ]
    assert _text(pass_short(steps[4], 200)) == "pass 2 · kept 3 of 5 + 1 drawn · this: drawn"
    assert pass_lines(steps[5], steps, 200) == [] and pass_short(steps[0], 200) == []  # plain passes: no rows


def test_the_panel_shows_the_pass_rows_and_gives_way_on_a_short_panel() -> None:
    r = _spec_reply()
    s = r.steps[4]
    full = _text(panel_lines(PanelView(record=r, step=s, live=s.settings, pinned=True, width=70)))
    assert full.startswith(
        "Forward pass 2 · token 5 · selected token of reply 1\npass 2 · checked 5 drafted tokens · kept 3 + 1 drawn"
    )
    assert "this token: drawn by the pass after the draft's" in full
    assert "after sampling) was refused" in full and "refused at" not in full  # this token's draw refused it
    assert "max surprisal: token " in full and "max surprisal: pass" not in full  # (a pass gave several)

    def fitted(height: int) -> str:  # at the panel's width beside a 120-column transcript
        return _text(panel_lines(PanelView(record=r, step=s, live=s.settings, pinned=True, width=48, height=height)))

    tall = len(fitted(0).splitlines())
    seen = set()
    for height in range(tall, tall - 16, -1):
        shown = " ".join(fitted(height).split())  # (the rows wrap at 48 cells)
        source = "drafted by prompt lookup" in shown
        row = "pass 2 · checked 5 drafted tokens · kept 3 + 1 drawn · 14.2 ms" in shown
        short = "pass 2 · kept 3 of 5 + 1 drawn · this: drawn" in shown
        assert row != short  # the pass row, whole or in one line, always
        if "this token:" not in shown:  # the pass rows give way once the candidates are down to 3
            assert "top 3 " in shown
        if "top 10 " not in shown:  # the draft's source row has gone before the candidates shrink
            assert not source
        seen.add((source, row, short))
    # the draft's source went first, then the candidates shrank, then the role, then the one line
    assert {(True, True, False), (False, True, False), (False, False, True)} <= seen
    compact = _text(panel_lines(PanelView(record=r, step=s, live=s.settings, pinned=True, width=80, compact=True)))
    assert "pass 2 · kept 3/5 + 1 · this: drawn" in compact  # (the compact panel's left half: 38 cells)
    # a plain step of the same reply: the panel as before (its title is its forward pass)
    plain = _text(panel_lines(PanelView(record=r, step=r.steps[5], live=s.settings, pinned=True, width=70)))
    assert plain.startswith("Forward pass 3 · token 6") and "drafted" not in plain  # pass 2 was its third


def test_tokens_per_pass_and_the_acceptance_rate_over_the_reply() -> None:
    steps = _spec_reply().steps
    verifying = [shape for shape in LAYOUT if shape is not None]
    gave = sum(k + int(d) for _, k, d in verifying) + sum(1 for shape in LAYOUT if shape is None)
    passes = 1 + len(LAYOUT) + (len(steps) - 1 - gave)  # step 0's (the prefill), LAYOUT's, the plain ones after
    drafted, kept = sum(d for d, _, _ in verifying), sum(k for _, k, _ in verifying)
    t = tally(steps)
    assert t is not None and (t.tokens, t.passes, t.verifying, t.drafted, t.kept) == (
        len(steps),
        passes,
        len(verifying),
        drafted,
        kept,
    )
    assert reply_part(steps) == (
        f"{len(steps) / passes:.2f} tokens a pass ({len(steps)} in {passes} passes) · "
        f"drafts kept {kept} of {drafted} ({kept / drafted * 100:.0f}%)"
    )
    assert tally(reply().steps) is None and reply_part(reply().steps) is None  # no draft: no phrase


def test_the_document_and_wire_views_say_which_pass_gave_a_token() -> None:
    r = _spec_reply()
    layout = lay_out(r, 80)
    tokens = layout.doc.tokens
    kept = tokens[layout.step_at(2)]
    assert _text([status_line(kept)]).endswith("step 2 · pass 2: drafted, kept")
    drawn = _text([status_line(tokens[layout.step_at(11)])])
    assert " · pass 5: drawn by the pass after the draft's " in drawn
    assert "pass" not in _text([status_line(tokens[layout.step_at(5)])])  # a plain pass: as before
    wire = ReplyWire(r)
    wire.sync()
    entries = {e.step: e for e in wire.entries if e.step is not None}
    assert entries[2].label == "token 3 · pass 2: drafted, kept" and entries[0].label == "pass 1"
    assert entries[5].label == "token 6 · pass 3"  # a plain pass after a verifying one
    # every step's forward pass, as the panel's title counts them
    labels = [entries[s.index].label for s in r.steps]
    assert [int(label.split("pass ")[1].split(":")[0]) for label in labels] == [
        forward_pass(r.steps, s) for s in r.steps
    ]
    assert forward_pass(r.steps, r.steps[-1]) == tally(r.steps).passes
    # a live reply (its list of steps growing, asked once a frame): the same numbers
    expected, growing = [forward_pass(r.steps, s) for s in r.steps], []
    for s in r.steps:
        growing.append(s)
        assert forward_pass(growing, growing[-1]) == expected[s.index] and forward_pass(growing, growing[0]) == 1
    assert [forward_pass(reply().steps, s) for s in reply().steps] == [s.index + 1 for s in reply().steps]
    # the wire view's title for a selected token: its chunk's pass
    assert pass_of_token(r.steps, 2) == "token 3, pass 2" and pass_of_token(reply().steps, 2) == "pass 3"
    # the step's chunk carries the pass fields in the loopchat extension
    data = json.loads(entries[2].text.removeprefix("data: "))
    step = data["loopchat"]["step"]
    assert step["pass_report"] == list(r.steps[2].pass_report) and step["drafted"] is True


def test_the_panel_s_settings_summary_wraps_the_draft_onto_a_line_of_its_own_not_mid_item() -> None:
    from loopchat.settings import SamplingSettings
    from loopchat.settings_text import summary_lines

    s = SamplingSettings(repeat_penalty=1.05, repeat_last_n=256, dry_multiplier=0.8, dry_penalty_last_n=4096)
    s = s.replace(max_tokens=512, draft="lookup")
    lines = summary_lines(s, 50)  # the panel beside a 120-column transcript: 50 cells
    assert all(len(line) <= 50 for line in lines), lines
    assert len(lines) == 3 and lines[2] == "  draft lookup ≤8"  # (it was wrapped as "· draft lookup ≤8")
    assert summary_lines(s.replace(draft="off"), 50)[1:] == lines[1:2]  # without the draft: two lines, as before
