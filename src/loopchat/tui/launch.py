"""Making and running the chat app: `create_app` (shared by the CLI, the tests and the
benchmarks) and `run_tui`."""

from __future__ import annotations

import sys
from pathlib import Path

from ..backends import Backend
from ..settings import SamplingSettings
from ..thread_tuner import Threads
from .app import LoopChatApp
from .prefs import Prefs


def create_app(
    *,
    config_path: str | None = None,
    model: str | None = None,
    replay: str | None = None,
    replay_speed: float = 1.0,
    verbose: bool = False,
    backend: Backend | None = None,
    prefs: Prefs | None = None,
    prefs_path: Path | None = None,
    settings: SamplingSettings | None = None,
    host: str | None = None,
    threads: Threads | None = None,
) -> LoopChatApp:
    """The app on a live model (or a trace with replay=FILE); raises ConfigError/TraceError.

    Pass `backend=` to share one loaded model between apps (it is then not closed on exit).
    """
    owns = backend is None
    if backend is None:
        if replay is not None:
            from ..backends.replay import ReplayBackend

            backend = ReplayBackend(replay, speed=replay_speed)
        else:
            from ..backends.live import DEFAULT_HOST, LiveBackend

            backend = LiveBackend(config_path, model, verbose=verbose, host=host or DEFAULT_HOST, threads=threads)
    return LoopChatApp(backend, prefs=prefs, prefs_path=prefs_path, owns_backend=owns, settings=settings)


def exit_on_signals(app: LoopChatApp) -> None:
    """SIGTERM and SIGHUP end the app the way Ctrl+Q does, so Textual gives the terminal
    back (main screen, mouse reporting off, cursor shown): Python's default for both is
    to die on the spot and leave the terminal in the app's modes. Call it on the app's
    event loop (its on_mount does, for run_tui)."""
    import asyncio
    import signal

    def quit_app() -> None:
        app._stop_backend()
        app.exit(0)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            loop.add_signal_handler(sig, quit_app)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread / OS
            pass


def run_tui(
    *,
    config_path: str | None,
    model: str | None,
    replay: str | None = None,
    replay_speed: float = 1.0,
    verbose: bool = False,
    host: str | None = None,
    threads: Threads | None = None,
) -> int:
    """Run the app until the user quits; returns the exit code (2: could not start)."""
    try:
        app = create_app(
            config_path=config_path, model=model, replay=replay, replay_speed=replay_speed, verbose=verbose,
            host=host, threads=threads,
        )
    except Exception as exc:  # ConfigError, TraceError: one-line messages
        print(f"loopchat: {exc}", file=sys.stderr)
        return 2
    app.handle_signals = True
    result = app.run()
    return int(result or 0)
