"""Errors shared between modules; each message is one line that says what to do.

Imports nothing of loopchat, so any module can raise these without an import cycle
(run_command.py raised cli.py's UsageError, and cli.py imports run_command)."""


class UsageError(Exception):
    """Bad input on the command line or stdin: printed as one line, exit code 2."""
