"""The loop panel's lines: one forward pass's record (candidates, timings, settings),
made from the latest Step event, or from a past step the user selected, as pure
functions of a `PanelView` (the widget, tui/loop_panel.py, draws them once per frame).

A reply from a remote server shows what the wire gave: the server's log-probabilities,
the arrival gaps between chunks (labelled so: not forward passes), and "not given" for
every figure the server does not send (Step fields that are None). A loopchat server
sends its engine's own record: its panel is as complete as a local one.

Cheap to make: every line is a tuple of (text, rich Style) pieces built with fixed-width
formatting (no rich Table or Group per frame); what a frame would otherwise recompute
over the whole reply is kept in `PanelCaches` (reply_index.py).

A short panel (80x24) gives way section by section (`fit`): the candidates first (down
to 3), so that the settings the keys change stay in view; step mode's die has its own
order (panel_pending.py).
"""

from __future__ import annotations

from rich.text import Text

from loopchat.chat.conversation import BLOCKING, finish_label
from loopchat.chat.pass_stats import forward_pass
from loopchat.chat.plots import fmt_prob, token_face
from loopchat.chat.views.fit import Form, Section, fit
from loopchat.chat.views.lines import BLANK, Line, Pieces, fit_lines, lines_to_text, width_of
from loopchat.chat.views.panel_candidates import candidates
from loopchat.chat.views.panel_constraint import FORCED, constraint_lines
from loopchat.chat.views.panel_latency import latency, prefill_text
from loopchat.chat.views.panel_passes import pass_lines, pass_short
from loopchat.chat.views.panel_pending import pending_lines
from loopchat.chat.views.panel_settings import compact_settings, settings_block
from loopchat.chat.views.panel_view import (
    BLOCKING_NOTE,
    DIM,
    DRAWN,
    GENERATING,
    HEAD,
    LABEL,
    NONE,
    WELCOME,
    PanelView,
    remote,
)
from loopchat.chat.views.panel_watch import watch_lines
from loopchat.chat.views.panel_waterfall import waterfall_lines, waterfall_short
from loopchat.chat.views.repeat_lines import repeat_lines
from loopchat.chat.views.reply_index import PanelCaches
from loopchat.event_lines import NOT_GIVEN
from loopchat.events import Step

_WELCOME_TEXT = (
    "Each reply is made one token at a time: the model runs a forward pass over the "
    "context, gets a probability for every token of its vocabulary, and the sampler "
    "draws one. Send a message to watch it happen."
)
_LATENCY_HEAD: Line = (("Latency", HEAD),)
#: on a short panel the sampler's waterfall gives way first (to one line), with a verifying
#: pass's least row, then the candidates (down to 3), then the pass's rows (to one line),
#: then the watched tokens' sparklines, then the screen cuts the end
WATERFALL, CANDIDATES, PASSES, WATCH = 0, 1, 2, 3


def _title(v: PanelView) -> list[Pieces]:
    r, s = v.record, v.step
    if s is None:
        return [[("The generation loop", HEAD)]]
    n = forward_pass(r.steps if r is not None else (), s)  # (index + 1 without a draft: pass_stats.py)
    t: Pieces = [(f"Forward pass {n}", HEAD)]
    if n != s.index + 1:
        t.append((f" · token {s.index + 1}", HEAD))  # under a draft a pass may give several tokens
    if s.index == 0:
        t.append((" · over the prompt", LABEL))
    if v.pinned and r is not None:
        t.append((f" · selected token of reply {r.number}", DRAWN))
    elif v.generating:
        t.append((" · generating", GENERATING))
    elif r is not None and r.finish is not None:
        label = finish_label(r.finish)
        t.append((f" · {label}" if v.compact else f" · done: {label}", LABEL))
    out = [t, *repeat_lines(s)]
    source = remote(v)
    if source and not v.compact:
        what = [(" · full record", LABEL)] if s.sampled_top is not None else []
        out.append([("server ", LABEL), (source, NONE), *what])
    if r is not None and r.mode == BLOCKING and not v.pinned:
        out.append([("blocking mode: what the model does while the caller waits", BLOCKING_NOTE)])
    return out


def _drawn(v: PanelView) -> list[Pieces]:
    s = v.step
    assert s is not None
    if s.chosen_by == "hand":
        sp = fmt_prob(s.sampled_prob) if s.sampled_prob else "cut by sampling"
        return [
            [
                ("picked by hand ", DRAWN),
                (token_face(s.piece, s.piece_bytes), DRAWN),
                (" · rank " + str(s.raw_rank) + " raw", LABEL),
            ],
            [("probability ", LABEL), (f"{fmt_prob(s.raw_prob or 0.0)} raw, {sp} after sampling", NONE)],
        ]
    first: Pieces = [("drew ", LABEL), (token_face(s.piece, s.piece_bytes), DRAWN)]
    if s.chosen_by == "step":
        first.append((" (a step you asked for)", LABEL))
    if s.is_stop:
        first.append((" (end of reply)", LABEL))
    if s.sampled_top is None:  # a server's logprobs
        if s.raw_rank is not None:
            first.append((f" · rank {s.raw_rank} in the server's logprobs", LABEL))
        elif s.raw_prob is not None:
            first.append((f" · not in the server's top {len(s.raw_top)}", LABEL))
    else:
        first.append((f" · rank {s.raw_rank} raw, {s.sampled_rank} sampled", LABEL))
    kept = s.candidates_kept
    if s.sampled_top is None and s.raw_entropy is None and kept is None:
        return [first, [("after sampling, entropy, tokens kept: ", LABEL), (NOT_GIVEN, DIM)]]
    second: Pieces = [("entropy ", LABEL)]
    if s.raw_entropy is None or s.sampled_entropy is None:
        second.append((NOT_GIVEN, DIM))
    else:
        second.append((f"{s.raw_entropy:.2f} → {s.sampled_entropy:.2f} bits", NONE))
    if kept is None:
        second += [(" · tokens kept ", LABEL), (NOT_GIVEN, DIM)]
    else:
        second.append((f" · {kept} token{'s' if kept != 1 else ''} kept", LABEL))
    return [first, second]


def _starting(v: PanelView) -> list[Pieces]:
    """A reply sent, its first pass not yet over: the prompt being read (a long one, or a
    conversation reopened, takes seconds on a CPU: the panel says what runs)."""
    r = v.record
    assert r is not None
    out: list[Pieces] = [[("Forward pass 1", HEAD), (" · reading the prompt", GENERATING)]]
    if r.mode == BLOCKING:
        out.append([("blocking mode: what the model does while the caller waits", BLOCKING_NOTE)])
    st, p = r.start, r.prefill
    if p is not None:
        out.append([("prefill ", LABEL), (prefill_text(p), NONE)])
    elif st is not None and st.prompt_token_ids is not None:
        ctx = f" (context {st.n_ctx:,})" if st.n_ctx else ""
        out.append([("prompt ", LABEL), (f"{len(st.prompt_token_ids):,} tokens{ctx}", NONE)])
    if p is None:
        remote = st is not None and st.prompt_token_ids is None
        out.append(
            [
                (
                    "waiting for the server's first chunk"
                    if remote
                    else "the first pass runs the model over the whole prompt at once (prefill, less what the "
                    "KV cache holds); the candidates of the first token appear when it ends",
                    WELCOME,
                )
            ]
        )
    return out


def _welcome(v: PanelView) -> list[Pieces]:
    lines: list[Pieces] = [[(_WELCOME_TEXT, WELCOME)]]
    if v.model:
        lines += [[], [("model ", LABEL), (v.model, NONE)]]
    return lines


def _compact(v: PanelView, caches: PanelCaches) -> list[Line]:
    """Two halves (the left one takes the odd cell), the left one ending in a 2-cell gap:
    the title and the top 5 on the left, the latency and the settings on the right."""
    width = v.width
    left_w = (width + 1) // 2 - 2
    right_w = width - left_w - 2
    half = max(30, width // 2 - 2)
    left_v = PanelView(**{**v.__dict__, "width": half})
    left = fit_lines(_title(v), left_w)
    left.extend(pass_short(v.step, left_w))
    below = waterfall_short(v.step, left_w) + _forced_short(v.step)
    fit_lines(watch_lines(v, spark=0), left_w, below)
    # the top 5 give way (down to 3) to the sampler's line and the tokens on watch
    k = max(3, min(5, v.height - len(left) - 1 - len(below))) if v.height else 5
    left.extend(candidates(left_v, left_w, k=k, bars=False))
    left.extend(below)
    right = fit_lines(latency(left_v, max(8, half - 22), caches), right_w, no_wrap=True)
    fit_lines(compact_settings(v, caches), right_w, right)
    out: list[Line] = []
    for i in range(max(len(left), len(right))):
        if i < len(left):
            a = left[i]
            gap = left_w - width_of(a) + 2
        else:
            a, gap = (), left_w + 2
        out.append(a + ((" " * gap, NONE), *right[i]) if i < len(right) else a)
    return out


def _forced_short(step: Step | None) -> list[Line]:
    """The compact panel's mark of a forced pass (the constraint left one token)."""
    if step is None or step.constraint is None or not step.constraint.forced:
        return []
    return [(("forced: the model had no say", FORCED),)]


def _no_step(v: PanelView, caches: PanelCaches) -> list[Line]:
    """No pass to show yet: the title (or the prompt being read), a welcome, the settings."""
    width = v.width
    starting = v.record is not None and v.generating
    out = fit_lines(_starting(v) if starting else _title(v), width)
    out.append(BLANK)
    if not starting:
        fit_lines(_welcome(v), width, out)
        out.append(BLANK)
    settings_block(v, width, out, caches)
    return out


def panel_lines(v: PanelView, caches: PanelCaches | None = None) -> list[Line]:
    """The panel as screen lines, each at most `v.width` cells wide, as many as
    `v.height` allows (0: no limit)."""
    caches = caches or PanelCaches()
    width = v.width
    if v.pending is not None and not v.pinned:
        return pending_lines(v, width)
    if v.step is None or v.record is None:
        return _no_step(v, caches)
    if v.compact:
        return _compact(v, caches)
    n_vocab = v.record.start.n_vocab if v.record.start is not None else None
    tail = fit_lines(_drawn(v) + constraint_lines(v.step, n_vocab), width)  # (a constraint's rows: its own module)
    watching = fit_lines(watch_lines(v), width)
    tail.append(BLANK)
    tail.append(_LATENCY_HEAD)
    fit_lines(latency(v, max(8, width - 30), caches), width, tail)
    tail.append(BLANK)
    settings_block(v, width, tail, caches)
    title, table = fit_lines(_title(v), width), candidates(v, width)
    steps = v.record.steps
    passes = pass_lines(v.step, steps, width)
    falls = waterfall_lines(v.step, width)
    if falls:
        falls.append(BLANK)
    if watching:
        watching.insert(0, BLANK)
    if not v.height or len(title) + len(passes) + len(table) + len(falls) + len(watching) + len(tail) <= v.height:
        return [*title, *passes, *table, *falls, *watching, *tail]  # (most frames)
    n = len(v.step.raw_top)
    sections = [
        Section(title, name="title"),
        Section(
            passes,
            (
                Form(WATERFALL, pass_lines(v.step, steps, width, source=False)),
                Form(PASSES, lambda over: pass_lines(v.step, steps, width, over, source=False)),
            ),
            name="pass",
        ),
        # fewer candidates (down to 3) before anything below is cut (the settings the
        # keys change stay in view as long as they can)
        Section(table, (Form(CANDIDATES, lambda over: candidates(v, width, k=max(3, n - over))),), name="candidates"),
        Section(falls, (Form(WATERFALL, waterfall_short(v.step, width)),), name="waterfall"),
        # the tokens on watch (the user asked for them): their sparklines go after the
        # candidates shrank, the rows stay (the screen cuts the end of the panel first)
        Section(watching, (Form(WATCH, fit_lines(watch_lines(v, spark=0), width)),), name="watching"),
        Section(tail, name="drawn, latency, settings"),
    ]
    return fit(sections, v.height)


def panel_renderable(v: PanelView) -> Text:
    """The whole panel as one Text (lines already fitted to `v.width`)."""
    return lines_to_text(panel_lines(v))
