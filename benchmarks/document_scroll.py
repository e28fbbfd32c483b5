"""The document view (Ctrl+T) of a ~4,000-token context: how long it takes to lay out,
and what scrolling it costs a frame.

The app replays tests/data/document.jsonl (a real reply of the default model, recorded
with the per-token texts), its reply's Start is given a prompt of ~4,000 real tokens
(the recorded prompt's tokens repeated, control tokens included), and Ctrl+T shows it.
Then, in the headless app:

- layout: the time Ctrl+T takes to lay the document out and draw its first screen;
- cursor: Down pressed through the whole document (the view scrolls with the cursor),
  then PgUp back to the top; each key's time from the press to the screen drawn
  (`pilot.press` + `pilot.pause`: the key handled, the frame composed);
- wheel: the body scrolled a row at a time from the top to the end (as a mouse wheel
  or the scrollbar does), each scroll's time to the screen drawn;

with p50 / p99 / max and how many exceeded a frame at the app's rate (1/FRAME_RATE s).
The harness's own share is measured first and printed beside them: a key that changes
nothing (`pilot.press` waits for the app to be idle, ~60 ms here) and a pause with
nothing to draw. `rows drawn` counts the body's render_line calls a frame: the rows on
screen at most, whatever the document's length.

    .venv/bin/python benchmarks/document_scroll.py [--tokens 4000] [--size 120x40]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

TRACE = ROOT / "tests" / "data" / "document.jsonl"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def summary(name: str, ms: list[float], budget: float, cpu: list[float]) -> str:
    over = sum(1 for v in ms if v > budget)
    return (
        f"{name:<8} {len(ms):4d} · wall p50 {statistics.median(ms):5.1f} ms, p99 {pct(ms, 0.99):5.1f}, max {max(ms):5.1f}"
        f" (over {budget:.0f} ms: {over}) · CPU p50 {statistics.median(cpu):5.2f} ms, p99 {pct(cpu, 0.99):5.2f}"
    )


class Clock:
    """Wall and CPU time (this thread: the app's) of each measured frame."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __enter__(self) -> Clock:
        self._t, self._c = time.perf_counter(), time.thread_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall.append((time.perf_counter() - self._t) * 1000)
        self.cpu.append((time.thread_time() - self._c) * 1000)

    def line(self, name: str, budget: float) -> str:
        return summary(name, self.wall, budget, self.cpu)


async def drive(tokens: int, size: tuple[int, int]) -> None:
    from loopchat.chat.event_pump import FRAME_RATE
    from loopchat.chat.prefs import Prefs
    from loopchat.tui.launch import create_app

    budget = 1000 / FRAME_RATE
    app = create_app(
        replay=str(TRACE), replay_speed=0, prefs=Prefs(markdown=False), prefs_path=Path("/dev/null"), history=False
    )
    async with app.run_test(size=size) as pilot:
        await asyncio.wait_for(app.run_finished.wait(), 30)
        rec = app.conversation.replies[0]
        s = rec.start
        reps = -(-tokens // len(s.prompt_token_ids))
        n = len(s.prompt_token_ids)
        ids = (s.prompt_token_ids * reps)[:tokens]
        texts = (s.prompt_token_texts * reps)[:tokens]
        special = tuple(p + k * n for k in range(reps) for p in s.prompt_special if p + k * n < tokens)
        rec.start = dataclasses.replace(
            s, prompt_token_ids=ids, prompt_token_texts=texts, prompt_special=special, prompt_text="".join(texts)
        )
        layout = Clock()
        with layout:
            await pilot.press("ctrl+t")
            await pilot.pause()
        doc = app.document
        rows = doc.doc.height
        print(
            f"document: {len(doc.doc.tokens):,} tokens ({tokens:,} in the prompt) · {rows:,} rows at {doc.doc.width} columns"
        )
        print(
            f"layout   Ctrl+T to the first screen drawn: {layout.wall[0]:.0f} ms wall, {layout.cpu[0]:.0f} ms CPU (once per reply and width)"
        )

        drawn = [0]
        render_line = doc.body.render_line

        def counting(y: int):
            drawn[0] += 1
            return render_line(y)

        doc.body.render_line = counting  # type: ignore[method-assign]
        idle_key, idle = Clock(), Clock()
        for _ in range(30):
            with idle_key:
                await pilot.press("f13")  # bound to nothing
                await pilot.pause()
            with idle:
                await pilot.pause()
        print(idle_key.line("idle key", budget) + "   (the harness: a key bound to nothing)")
        print(idle.line("idle", budget) + "   (the harness: a pause, nothing to draw)")

        await pilot.press("home")
        await pilot.pause()
        drawn[0] = 0
        cursor = Clock()
        while doc.body.cursor < doc.reply_start - 1:
            with cursor:
                await pilot.press("down")
                await pilot.pause()
        while doc.body.scroll_offset.y > 0:
            with cursor:
                await pilot.press("pageup")
                await pilot.pause()
        print(cursor.line("cursor", budget) + f"   rows drawn: {drawn[0] / len(cursor.wall):.1f} a frame")
        drawn[0] = 0

        wheel = Clock()
        body = doc.body
        for y in range(0, max(1, int(body.max_scroll_y)) + 1):
            with wheel:
                body.scroll_to(y=y, animate=False)
                await pilot.pause()
        print(wheel.line("wheel", budget) + f"   rows drawn: {drawn[0] / len(wheel.wall):.1f} a frame")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--size", default="120x40")
    args = ap.parse_args()
    w, h = (int(v) for v in args.size.split("x"))
    asyncio.run(drive(args.tokens, (w, h)))


if __name__ == "__main__":
    main()
