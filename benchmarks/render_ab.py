"""UI-thread CPU per streamed token, A against B: two ways of drawing the app, side by side.

Each run is a fresh process: the app, headless at 120x40 (plain tokens, no Markdown),
plays tests/data/reply.jsonl at once (warm-up: first paints, caches), then one long reply
(the recorded steps repeated, --tokens of them) arrives at 100 tokens/s from another
thread, as from the model. The figure is the UI thread's CPU time (`time.thread_time()`)
from the first token until the reply has been drawn, per token. A and B alternate
(A B, B A, ...) for --rounds rounds; printed: each side's median and range, and B/A
round by round (median and range), which is what to judge on this shared machine.

    .venv/bin/python benchmarks/render_ab.py [--ab stock-render] [--rounds 6] [--tokens 1500]

--ab stock-render: A = the fast paths of tui/render/, B = Textual's stock rendering
                   (LOOPCHAT_STOCK_RENDER=1, what an untested Textual version gets).
--ab scrollbar:    A = the transcript's row-cached scrollbar, B = Textual's own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
TRACE = ROOT / "tests" / "data" / "reply.jsonl"
SIZE = (120, 40)

#: --ab NAME -> (what A is, what B is)
AB = {
    "stock-render": ("fast paths", "stock rendering"),
    "scrollbar": ("row-cached scrollbar", "Textual's scrollbar"),
}


def _variant(ab: str, side: str) -> None:
    """Set this process up as side `side` ("A" or "B") of the comparison `ab`."""
    if side == "A":
        return
    if ab == "stock-render":
        os.environ["LOOPCHAT_STOCK_RENDER"] = "1"
    elif ab == "scrollbar":
        from textual.widget import Widget

        from loopchat.tui.transcript import Transcript

        Transcript.vertical_scrollbar = Widget.vertical_scrollbar  # Textual's own property


def child(ab: str, side: str, tokens: int) -> dict:
    _variant(ab, side)
    import dataclasses

    from loopchat.chat.prefs import Prefs
    from loopchat.events import Finish, Start, Step
    from loopchat.trace import read_trace
    from loopchat.tui.launch import create_app

    _, traced = read_trace(TRACE)
    reply = [te.event for te in traced]
    steps = [e for e in reply if isinstance(e, Step) and not e.is_stop]
    start = next(e for e in reply if isinstance(e, Start))
    finish = next(e for e in reply if isinstance(e, Finish))
    prefill = [e for e in reply if e.kind == "prefill"]
    feed = [start, *prefill]
    feed += [dataclasses.replace(steps[i % len(steps)], index=i) for i in range(tokens)]
    feed.append(dataclasses.replace(finish, steps=tokens, completion_tokens=tokens, text=""))

    app = create_app(replay=str(TRACE), replay_speed=0, prefs=Prefs(markdown=False), prefs_path=Path(os.devnull))

    async def drive() -> dict:
        async with app.run_test(size=SIZE, headless=True) as pilot:
            await asyncio.wait_for(app.run_finished.wait(), 30)
            await pilot.pause(0.2)
            app.run_finished.clear()
            loop = asyncio.get_running_loop()
            fed = asyncio.Event()

            def feeder() -> None:
                for e in feed:
                    app.pump.emit(e)
                    if isinstance(e, Step):
                        time.sleep(0.01)  # the "model": 100 tokens/s
                loop.call_soon_threadsafe(fed.set)

            cpu0, frames0 = time.thread_time(), app.frames_rendered
            threading.Thread(target=feeder, daemon=True).start()
            await fed.wait()  # the UI thread only runs the app meanwhile
            await asyncio.wait_for(app.run_finished.wait(), 30)
            await asyncio.sleep(0.2)  # the last frame
            cpu = time.thread_time() - cpu0
            bar = type(app.transcript.vertical_scrollbar).__name__
            return {
                "ui_ms_per_token": cpu * 1000 / tokens,
                "frames": app.frames_rendered - frames0,
                "scrollbar": bar,
                "screen": type(app.screen).__name__,
            }

    return asyncio.run(drive())


def run_child(ab: str, side: str, tokens: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "LOOPCHAT_STOCK_RENDER"}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", ab, side, str(tokens)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    if proc.returncode != 0:
        raise SystemExit(f"child {ab} {side} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ab", choices=sorted(AB), default="stock-render")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=1500)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        ab, side, tokens = args.child
        print(json.dumps(child(ab, side, int(tokens))))
        return

    a_name, b_name = AB[args.ab]
    print(
        f"{os.cpu_count()} CPUs; A = {a_name}, B = {b_name}; {args.rounds} rounds, A and B alternating, "
        f"each a fresh process streaming {args.tokens} tokens at 100 tok/s"
    )
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
            res = run_child(args.ab, side, args.tokens)
            runs[side].append(res)
            print(
                f"round {r + 1}  {side}  {res['ui_ms_per_token']:.3f} ms/token  {res['frames']} frames  "
                f"({res['screen']}, {res['scrollbar']})",
                flush=True,
            )
    a = [x["ui_ms_per_token"] for x in runs["A"]]
    b = [x["ui_ms_per_token"] for x in runs["B"]]
    ratios = [y / x for x, y in zip(a, b)]
    print()
    print(f"A ({a_name}): {statistics.median(a):.3f} ms/token (range {min(a):.3f}-{max(a):.3f})")
    print(f"B ({b_name}): {statistics.median(b):.3f} ms/token (range {min(b):.3f}-{max(b):.3f})")
    print(
        f"B/A by round: median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}); "
        f"ratio of medians {statistics.median(b) / statistics.median(a):.3f}"
    )


if __name__ == "__main__":
    main()
