"""The command line: `loopchat` (main.py), `run`, `history`; each command imports what it needs late."""
