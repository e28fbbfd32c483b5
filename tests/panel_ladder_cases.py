"""The loop panel's shrink-to-fit cases, over the recorded reply (tests/data/reply.jsonl,
a real reply of the default model): a pass shown (the full panel, a live and a selected
token, a remote server's reply), the loop stopped before a draw (step mode) and the
compact panel, each at every height from taller than the panel down to 1 line.

`tests/data/panel_ladder.json` holds the panel's lines for each case and height, recorded
from the code before `fit()` replaced the five-step ladder (each output once, styles
included). Run `python tests/panel_ladder_cases.py record` to record it again.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from loopchat.chat.conversation import STREAM, ReplyRecord
from loopchat.events import Finish, Pending, Prefill, Start, Step
from loopchat.trace import read_trace

DATA = Path(__file__).parent / "data"
REPLY_TRACE = DATA / "reply.jsonl"
LADDER = DATA / "panel_ladder.json"


@functools.cache
def _events() -> tuple[Any, ...]:
    _, traced = read_trace(REPLY_TRACE)
    return tuple(t.event for t in traced)


def reply(done: bool = True, remote: bool = False) -> ReplyRecord:
    """The recorded reply as the chat keeps it (`remote`: as a server that sends only its
    logprobs would have given it: no sampled-from distribution, no pass times)."""
    events = _events()
    start = next(e for e in events if isinstance(e, Start))
    steps = [e for e in events if isinstance(e, Step)]
    if remote:
        start = dataclasses.replace(start, source="http://127.0.0.1:8080", prompt_token_ids=None)
        steps = [
            dataclasses.replace(
                s,
                sampled_top=None,
                sampled_prob=None,
                sampled_rank=None,
                sampled_entropy=None,
                candidates_kept=None,
                forward_ms=None,
                sample_ms=None,
                arrival_ms=12.0 + s.index % 5,
                threads=None,
            )
            for s in steps
        ]
    r = ReplyRecord(1, STREAM, start.messages)
    r.start = start
    r.prefill = None if remote else next(e for e in events if isinstance(e, Prefill))
    r.steps = steps
    r.finish = next(e for e in events if isinstance(e, Finish)) if done else None
    return r


def pending(r: ReplyRecord, at: int) -> Pending:
    """The loop stopped before the draw of step `at`: its die as the recorded step had it
    (the record keeps the steps before it)."""
    s = r.steps[at]
    r.steps = r.steps[:at]
    r.finish = None
    assert s.sampled_top is not None and s.candidates_kept is not None
    return Pending(
        index=s.index,
        raw_top=s.raw_top,
        sampled_top=s.sampled_top,
        raw_entropy=s.raw_entropy or 0.0,
        sampled_entropy=s.sampled_entropy or 0.0,
        candidates_kept=s.candidates_kept,
        forward_ms=s.forward_ms or 0.0,
        forward_tokens=1,
        sample_ms=s.sample_ms or 0.0,
        settings=s.settings,
        n_past=40 + s.index,
    )


def _pass(width: int, **kw: Any) -> Callable[[int], Any]:
    from loopchat.chat.views.panel_view import PanelView

    def view(height: int) -> Any:
        r = reply(remote=kw.get("remote", False), done=not kw.get("generating", False))
        s = r.steps[kw.get("at", -1)]
        return PanelView(
            record=r,
            step=s,
            live=s.settings,
            pinned=kw.get("pinned", False),
            generating=kw.get("generating", False),
            compact=kw.get("compact", False),
            width=width,
            height=height,
            knob=kw.get("knob", "temperature"),
        )

    return view


def _stopped(width: int, at: int, knob: str = "temperature") -> Callable[[int], Any]:
    from loopchat.chat.views.panel_view import PanelView

    def view(height: int) -> Any:
        r = reply(done=False)
        p = pending(r, at)
        return PanelView(
            record=r, step=None, live=p.settings, generating=True, width=width, height=height, knob=knob, pending=p
        )

    return view


#: name -> a function of the height giving the PanelView
CASES: dict[str, Callable[[int], Any]] = {
    "pass-60": _pass(60),
    "pass-44": _pass(44),
    "pass-live-72": _pass(72, generating=True),
    "pass-pinned-60": _pass(60, pinned=True, at=7, knob="top_p"),
    "pass-remote-60": _pass(60, remote=True),
    "pass-compact-80": _pass(80, compact=True),
    "stopped-60": _stopped(60, at=9),
    "stopped-44": _stopped(44, at=9, knob="min_p"),
    "stopped-first-72": _stopped(72, at=0),
}


def encode(lines: list[tuple[tuple[str, Any], ...]]) -> list[list[list[str]]]:
    return [[[text, str(style)] for text, style in line] for line in lines]


def outputs(name: str) -> Iterator[tuple[int, list[list[list[str]]]]]:
    """(height, the panel's lines) from unbounded (0) and 4 lines taller than the panel down to 1."""
    from loopchat.chat.views.panel import panel_lines

    view = CASES[name]
    full = panel_lines(view(0))
    yield 0, encode(full)
    for height in range(len(full) + 4, 0, -1):
        yield height, encode(panel_lines(view(height)))


def _intern(table: list[Any], seen: dict[str, int], value: Any) -> int:
    key = json.dumps(value, ensure_ascii=False)
    if key not in seen:
        seen[key] = len(table)
        table.append(value)
    return seen[key]


def record() -> None:
    """Each distinct line once ("lines"), each distinct output once as its line numbers
    ("outputs"), each case as height -> output number."""
    table: dict[str, Any] = {"lines": [], "outputs": [], "cases": {}}
    seen_lines: dict[str, int] = {}
    seen_outputs: dict[str, int] = {}
    for name in CASES:
        heights = {}
        for height, lines in outputs(name):
            numbers = [_intern(table["lines"], seen_lines, line) for line in lines]
            heights[str(height)] = _intern(table["outputs"], seen_outputs, numbers)
        table["cases"][name] = heights

    def dump(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    parts = [f'"{key}":[\n' + ",\n".join(dump(v) for v in table[key]) + "\n]" for key in ("lines", "outputs")]
    parts.append('"cases":{\n' + ",\n".join(f"{dump(k)}:{dump(v)}" for k, v in table["cases"].items()) + "\n}")
    LADDER.write_text("{" + ",\n".join(parts) + "}\n", encoding="utf-8")
    n = sum(len(h) for h in table["cases"].values())
    print(f"{LADDER}: {len(table['outputs'])} outputs, {len(table['lines'])} lines, over {n} heights")


def expected(name: str) -> dict[int, list[list[list[str]]]]:
    """The recorded lines of case `name`, by height."""
    table = json.loads(LADDER.read_text(encoding="utf-8"))
    lines, outs = table["lines"], table["outputs"]
    return {int(h): [lines[i] for i in outs[o]] for h, o in table["cases"][name].items()}


if __name__ == "__main__" and sys.argv[1:] == ["record"]:
    record()
