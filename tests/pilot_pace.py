"""How often Textual's Pilot looks whether the app is idle (issue 23, item 8).

After every key it sends (`Pilot.press`, and `Pilot.pause()` without a delay) the Pilot
waits until the process looks idle: `textual._wait.wait_for_idle` sleeps in steps of
SLEEP_GRANULARITY (1/50 s) until a step's process CPU is under SLEEP_IDLE (1/20 of the
step). A key the app handles in a millisecond therefore costs at least two 20 ms sleeps:
typing a 30-character prompt ~1.2 s of wall time in which the test's process does nothing.
Here the step is 2 ms and the bar 1/20 of it, the same proportion: the Pilot still waits
while the process works (up to its 1 s cap, as before) and goes on as soon as two short
steps find it idle. Measured: test_tui_constraint + test_tui_step 53.6 -> 24.4 s of wall time,
the suite's parallel part 380 -> 346 s (docs/performance.md, "The suite in the eighth session").

These are private names of Textual, used by tests only and quarantined here, as src keeps
its private Textual API in its render folder: where a Textual release renames them,
`quicken` changes nothing and says so (the tests keep Textual's own pace, slower).
"""

from __future__ import annotations

import importlib

STEP_S = 1 / 500  # a poll every 2 ms (Textual's own: 1/50 s)


def quicken(module: str = "textual._wait") -> str | None:
    """Set the Pilot's idle poll to STEP_S; None, or why it was left as it is."""
    try:
        wait = importlib.import_module(module)
    except ImportError:
        return f"{module} is gone: the Pilot keeps Textual's own pace"
    if not isinstance(getattr(wait, "SLEEP_GRANULARITY", None), float) or not hasattr(wait, "SLEEP_IDLE"):
        return f"{module} has no SLEEP_GRANULARITY / SLEEP_IDLE: the Pilot keeps Textual's own pace"
    wait.SLEEP_GRANULARITY = STEP_S
    wait.SLEEP_IDLE = STEP_S / 20.0
    return None
