"""The import graph: the layers below the chat app load no Textual, and the headless
command needs nothing of the command line's module."""

from __future__ import annotations

import subprocess
import sys


def python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_run_command_raises_usage_errors_without_importing_cli() -> None:
    # run_command.py raised cli.py's UsageError, and cli.py imports run_command: a cycle
    out = python(
        "import sys\n"
        "from loopchat.errors import UsageError\n"
        "from loopchat.cli.run import read_prompt\n"
        "try:\n"
        "    read_prompt('   ', None)\n"
        "except UsageError as exc:\n"
        "    print(type(exc).__module__, 'loopchat.cli.main' in sys.modules)\n"
    )
    assert out == "loopchat.errors False"


ENGINE_LAYER = (
    "loopchat.engine.engine",
    "loopchat.engine.options",
    "loopchat.engine._llama_ffi",
    "loopchat.engine.chat_prompt",
    "loopchat.cli.run",
    "loopchat.engine.worker",
    "loopchat.engine.process_worker",
    "loopchat.trace",
    "loopchat.config",
    "loopchat.events",
    "loopchat.settings",
    "loopchat.engine.sampler",
    "loopchat.errors",
    "loopchat.cli.main",
    "loopchat.chat.reply_stats",
)


def loads_textual(*modules: str) -> bool:
    """Whether importing `modules` in a fresh interpreter loads any part of Textual."""
    out = python(
        f"import {', '.join(modules)}; import sys\n"
        "print(any(m == 'textual' or m.startswith('textual.') for m in sys.modules))\n"
    )
    return {"True": True, "False": False}[out]


def test_the_engine_layer_loads_no_textual() -> None:
    assert loads_textual("loopchat.tui.app")  # the check can fail: the chat app does load it
    assert not loads_textual(*ENGINE_LAYER)
