"""Errors shared between modules; each message is one line that says what to do.

Imports nothing of loopchat, so any module can raise these without an import cycle
(run_command.py raised cli.py's UsageError, and cli.py imports run_command)."""


def one_line(text: str) -> str:
    """`text` (an exception's message, say) folded onto one line."""
    return " ".join(text.split())


class UsageError(Exception):
    """Bad input on the command line or stdin: printed as one line, exit code 2."""


class EngineError(Exception):
    """A problem the user can act on in the engine's input or model (engine.py re-exports it)."""


class ModelLoadError(EngineError):
    """The model file or its chat template cannot be loaded."""


class ContextOverflowError(EngineError):
    """The prompt does not fit the model's context window, even after trimming."""
