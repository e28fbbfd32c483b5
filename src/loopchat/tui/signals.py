"""SIGTERM and SIGHUP end the chat the way Ctrl+Q does (run_tui asks for it, the app's
on_mount installs it)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable


def exit_on_signals(quit_app: Callable[[], None]) -> None:
    """SIGTERM and SIGHUP call `quit_app` (the app's own Ctrl+Q), so Textual gives the
    terminal back (main screen, mouse reporting off, cursor shown): Python's default for
    both is to die on the spot and leave the terminal in the app's modes. Call it on the
    app's event loop."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            loop.add_signal_handler(sig, quit_app)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread / OS
            pass
