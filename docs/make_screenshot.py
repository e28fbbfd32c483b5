"""Make docs/screenshot.svg: the real app on the default model, mid-reply, with a
temperature change made at one pass and the loop held a dozen passes later.

    .venv/bin/python docs/make_screenshot.py
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))

from tui_fixtures import StepGate, wait_for  # noqa: E402

from loopchat.backends.live import LiveBackend  # noqa: E402
from loopchat.settings import SamplingSettings  # noqa: E402
from loopchat.tui.launch import create_app  # noqa: E402
from loopchat.tui.prefs import Prefs  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


async def main() -> None:
    backend = LiveBackend(None, None, threads=1)
    app = create_app(
        backend=backend, prefs=Prefs(markdown=False, prob_colours=True), prefs_path=HERE / ".screenshot-prefs.json",
        settings=SamplingSettings(temperature=0.6, top_k=40, top_p=0.95, min_p=0.02, seed=11, max_tokens=400),
    )
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, app.model_ready.is_set, 60, "the model")
            first = StepGate(app, after=40)
            await pilot.press(*PROMPT, "enter")
            await wait_for(pilot, lambda: first.holding, 60, "pass 40")
            await pilot.press("ctrl+up", "ctrl+up")  # temperature 0.6 -> 0.8 from pass 41
            second = StepGate(app, after=12)
            first.release()
            await wait_for(pilot, lambda: second.holding, 60, "pass 52")
            await pilot.pause(0.5)  # a few frames
            app.save_screenshot(str(HERE / "screenshot.svg"))
            second.release()
            app.session.cancel()
    finally:
        backend.close()
        (HERE / ".screenshot-prefs.json").unlink(missing_ok=True)


if __name__ == "__main__":
    asyncio.run(main())
