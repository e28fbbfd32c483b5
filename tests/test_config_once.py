"""models.toml is parsed once per launch: the launcher reads it and hands the parsed Config
down; the backends never read it themselves (issue 23).

Counted for real: a child Python process installs an audit hook (sys.addaudithook) that
counts every `open` of the models.toml file, then launches the chat app (create_app, as
`loopchat` does, on a models.toml with a model run here and one on a server: the
ModelsBackend path, which read the file three times before), `loopchat run` on the
default model and `loopchat models`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.model, pytest.mark.server]  # loopchat processes, one loading the model

CHILD = r"""
import contextlib, io, json, os, sys

path = sys.argv[1]
opened = []


def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) and os.fsdecode(args[0]) == path:
        opened.append(event)


sys.addaudithook(hook)
counts = {}

from loopchat.tui.launch import create_app

app = create_app(config_path=path, history=False)
counts["chat"] = len(opened)
app.backend.close()

from loopchat.cli.main import main


del opened[:]
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["run", "--config", path, "--max-tokens", "2", "--seed", "1", "Hi"])
counts["run"] = len(opened) if code == 0 else f"exit {code}"

del opened[:]
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["models", "--config", path])
counts["models"] = len(opened) if code == 0 else f"exit {code}"
print(json.dumps(counts))
"""

MODELS_TOML = """\
[models.here]
builtin = "smollm2-135m-instruct"
threads = 1

[models.far]
url = "http://127.0.0.1:9/v1"
model = "anything"
"""


def test_models_toml_is_read_once_per_launch(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(MODELS_TOML, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=180, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts == {"chat": 1, "run": 1, "models": 1}, (counts, done.stderr[-2000:])
