"""UI toggles remembered across runs, stored as JSON in the user's data folder.

The folder is paths.data_dir(): $LOOPCHAT_DATA_DIR when set (tests use a temporary
one), otherwise platformdirs' user data dir for loopchat. A missing or unreadable file
gives defaults.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from loopchat.paths import data_dir
from loopchat.private_files import private_dir

PREFS_FILE = "tui-prefs.json"


@dataclass
class Prefs:
    token_boundaries: bool = False  # alternate backgrounds show where each token starts
    #: F6's third state: the backgrounds alternate by forward pass (a draft's tokens kept by one pass share one)
    token_passes: bool = False
    prob_colours: bool = False  # colour each token by the probability it was drawn with
    #: colour each token by its lens depth (chat/lens_depth.py; read for each reply when asked)
    lens_colours: bool = False
    forced_marks: bool = False  # mark the tokens a constraint forced (the only one allowed at their pass)
    markdown: bool = True  # render completed replies as Markdown
    streaming: bool = True  # False: blocking mode (whole reply shown at the end)
    wire_view: bool = False  # the side panel shows the wire (SSE lines) instead of the loop
    wire_folded: bool = True  # the wire view folds the long values (extension, top_logprobs)
    history: bool = True  # keep the conversations in the store (history/); off: nothing is written
    completion_space: bool = True  # completion mode: a space before typed text that would glue to a word

    @classmethod
    def from_dict(cls, data: dict) -> Prefs:
        """The known toggles of `data` that are true or false (others keep their default)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known and isinstance(v, bool)})


def prefs_path() -> Path:
    return data_dir() / PREFS_FILE


def load_prefs(path: Path | None = None) -> Prefs:
    path = path or prefs_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Prefs()
    return Prefs.from_dict(data) if isinstance(data, dict) else Prefs()


def save_prefs(prefs: Prefs, path: Path | None = None) -> str | None:
    """Write the prefs; returns an error message instead of raising."""
    path = path or prefs_path()
    try:
        private_dir(path.parent)  # the data folder: 0700 (private_files.py)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(prefs), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        return f"could not save UI preferences to {path}: {exc.strerror or exc}"
    return None
