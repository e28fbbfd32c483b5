"""Conversations kept on disk (issue 14): the SQLite store (store.py, schema.py), compact
step records (step_codec.py), the writer thread the chat hands its writes to (writer.py),
and export / import (export.py). No Textual here: the CLI (`loopchat history`) uses it too."""
