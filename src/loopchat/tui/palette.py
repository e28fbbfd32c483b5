"""The command palette's entries that Textual gives every app, made loopchat's own:
"Keys" opens F1's list (the app's help screen, which Esc closes) rather than Textual's
generic key panel, and "Screenshot" saves to the downloads folder or, where there is
none, to loopchat's data folder, and says where."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import platformdirs
from textual.app import SystemCommand

from loopchat.paths import data_dir


def screenshot_folder() -> Path:
    """The user's downloads folder if it exists, else loopchat's data folder (made)."""
    downloads = platformdirs.user_downloads_path()
    if downloads.is_dir():
        return downloads
    folder = data_dir()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def own_system_commands(app: Any, stock: Iterable[SystemCommand]) -> Iterable[SystemCommand]:
    """Textual's system commands with Keys and Screenshot replaced."""
    for command in stock:
        if command.title == "Keys":
            yield SystemCommand("Keys", "The list of loopchat's keys (F1; Esc closes it)", app.action_help)
        elif command.title == "Screenshot":
            yield SystemCommand(
                "Screenshot",
                "Save an SVG 'screenshot' of the screen (to Downloads, else loopchat's data folder)",
                lambda: app.set_timer(0.1, lambda: app.deliver_screenshot(path=str(screenshot_folder()))),
            )
        else:
            yield command
