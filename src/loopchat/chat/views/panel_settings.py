"""The loop panel's sampling settings: between replies those the next reply will use
(the keys change them), during a reply or on a selected token those in force at the pass
shown; what changed and at which pass, and what the next pass will use."""

from __future__ import annotations

from loopchat.chat.views.lines import Line, Pieces, fit_lines, rstrip
from loopchat.chat.views.panel_view import BOLD, CHANGED, DIM, DRAWN, HEAD, LABEL, NONE, PENDING, PanelView, remote
from loopchat.chat.views.reply_index import PanelCaches
from loopchat.settings import KNOBS, SETTING, fmt_value
from loopchat.settings_text import summary_lines


def settings_block(v: PanelView, width: int, out: list[Line], caches: PanelCaches) -> None:
    """The settings block, fitted to `width` (cached until anything it shows changes)."""
    r, s = v.record, v.step
    # between replies the settings the next reply will use (the keys change them); during
    # a reply, or on a selected token, those in force at the pass shown
    ahead = s is None or (v.takes_messages and not v.generating and not v.pinned)
    shown = v.live if ahead or s is None else s.settings  # (ahead when s is None)
    changes = caches.changes(r) if s is not None else {}
    key = (
        width,
        shown,
        v.knob,
        tuple(changes.items()),
        s is None,
        s is None and v.generating,
        (s.settings_changed, s.index > 0) if s is not None else None,
        s.index if (s is not None and v.pinned) else None,
        v.live if (s is not None and v.generating and not v.pinned) else None,
        remote(v),
    )
    if caches.settings is not None and caches.settings[0] == key:
        out.extend(caches.settings[1])
        return
    when = "  (at this pass)" if not ahead else "  (its first draw)" if s is None and v.generating else "  (next reply)"
    lines: list[Pieces] = [[("Sampling settings", HEAD), (when, LABEL)]]
    for name in KNOBS:
        value = getattr(shown, name)
        t: Pieces = [
            ("▸ " if name == v.knob else "  ", DRAWN),
            (f"{SETTING[name].label:<12}", BOLD if name == v.knob else LABEL),
            (f"{fmt_value(name, value):>6}", NONE),
        ]
        at = changes.get(name)
        was = getattr(s.settings, name) if s is not None else value
        if ahead and s is not None and r is not None and was != value:
            t.append((f"  reply {r.number} had {fmt_value(name, was)}", PENDING))
        elif s is not None and name in s.settings_changed and s.index > 0:
            t.append(("  ◀ changed at this pass", CHANGED))
        elif at is not None and (not v.pinned or (s is not None and at <= s.index)):
            t.append((f"  changed at pass {at + 1}", CHANGED))
        pending = getattr(v.live, name)
        if s is not None and v.generating and not v.pinned and pending != value:
            when = "next reply" if remote(v) else "from next pass"  # a server fixed this reply's
            t.append((f"  → {fmt_value(name, pending)} {when}", PENDING))
        lines.append(t)
    lines += [[(text, LABEL)] for text in summary_lines(shown, width)]  # repeat · DRY · seed · max
    lines.append([("  ^↑/^↓ change ▸ · F8 next · F2 type values", DIM)])
    other = [n for n in changes if n not in KNOBS]
    if other:
        lines.append([("  changed: " + ", ".join(f"{n} at pass {changes[n] + 1}" for n in other), CHANGED)])
    fitted: list[Line] = []
    fit_lines(lines, width, fitted)
    caches.settings = (key, fitted)
    out.extend(fitted)


def compact_settings(v: PanelView, caches: PanelCaches) -> list[Pieces]:
    s = v.step
    ahead = s is None or (v.takes_messages and not v.generating and not v.pinned)
    shown = v.live if ahead or s is None else s.settings  # (ahead when s is None)
    changes = {} if ahead else caches.changes(v.record)
    lines: list[Pieces] = []
    t: Pieces = []
    for i, name in enumerate(KNOBS):
        t.append(("▸" if name == v.knob else " ", DRAWN))
        t.append((f"{SETTING[name].short} ", LABEL))
        t.append((fmt_value(name, getattr(shown, name)), CHANGED if name in changes else NONE))
        if name in changes:
            t.append((f"@{changes[name] + 1}", CHANGED))
        if i % 2 == 0:
            t.append(("  ", NONE))
        else:
            lines.append(t)
            t = []
    rstrip(lines[-1])
    return lines
