"""tools/house_check.py (run by `make lint`): each house rule is caught where it is broken, with
its file and line, and a tree that keeps them all passes. Run as make runs it: a subprocess on a
package written to a temporary folder, with its own layers contract."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHECK = ROOT / "tools" / "house_check.py"

LAYERS = """
[[tool.importlinter.contracts]]
name = "layers"
type = "layers"
containers = ["pkg"]
layers = ["top", "left | right", "mid", "base : util"]
"""


def _function(name: str, body_lines: int, decorated: bool = False) -> str:
    """A function of 1 + body_lines lines (the decorator, if any, not counted)."""
    head = "@staticmethod\n" if decorated else ""
    return head + f"def {name}():\n" + "".join(f"    x{i} = {i}\n" for i in range(body_lines)) + "\n"


def _tree(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    pkg = tmp_path / "src" / "pkg"
    for rel, text in {"__init__.py": "", "mid/__init__.py": "", "util/__init__.py": "", **files}.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "pyproject.toml").write_text(LAYERS)
    return pkg


def _run(tmp_path: pathlib.Path, pkg: pathlib.Path) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, str(CHECK), str(pkg), "--pyproject", str(tmp_path / "pyproject.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert not done.stderr, done.stderr
    return done.returncode, done.stdout.splitlines()


def test_a_tree_that_keeps_the_rules_passes(tmp_path):
    files = {
        "top.py": "from pkg import left, right\nfrom pkg.mid import thing\n",
        "left.py": "from pkg.mid import thing\n",
        "right.py": "def later():\n    from pkg import base\n",
        "mid/thing.py": "from pkg import base, util\nfrom . import other\n",
        "mid/other.py": "from ..util import helper\n",
        "mid/long_ok.py": _function("eighty", 79) + _function("decorated", 79, decorated=True),
        "mid/size_ok.py": "x = 1\n" * 450,
        "base.py": "from pkg.util import helper\n",  # "base : util": siblings that may import each other
        "util/helper.py": "import os\n",
    }
    code, out = _run(tmp_path, _tree(tmp_path, files))
    assert code == 0, out
    assert out == ["house rules hold: 12 modules, functions <= 80 lines, modules <= 450, no import cycles, no climbs"]


def test_each_breach_is_reported_with_its_file_and_line(tmp_path):
    files = {
        "top.py": "",
        "left.py": "from pkg import right\n",  # independent siblings
        "right.py": "",
        "mid/__init__.py": "x = 1\nimport pkg.top\n",  # climbs: mid -> top
        # a cycle closed by an import inside a function and a relative import
        "mid/thing.py": "def later():\n    from pkg.mid import other\n",
        "mid/other.py": "from . import thing\n",
        "mid/long.py": "import os\n\n" + _function("eighty_one", 80),  # its def on line 3
        "mid/long_ok.py": _function("eighty", 79) + _function("decorated", 79, decorated=True),
        "mid/size.py": "x = 1\n" * 451,
        "mid/size_ok.py": "x = 1\n" * 450,
        "base.py": "from pkg.util import helper\n",
        "util/helper.py": "import os\n\n\ndef f():\n    import pkg.mid.thing\n",  # climbs, lazily
        "stray.py": "",  # in no layer
        # the package root's own imports count for whoever imports from the root (as in lint-imports)
        "__init__.py": "from pkg.mid import thing\n",
        "util/version.py": "from pkg import __version__\n",
    }
    pkg = _tree(tmp_path, files)
    code, out = _run(tmp_path, pkg)
    text = "\n".join(out)
    assert code == 1, text
    assert f"{pkg}/mid/long.py:3: function eighty_one: 81 lines (max 80)" in out
    assert f"{pkg}/mid/size.py:1: module pkg.mid.size: 451 lines (max 450)" in out
    assert f"{pkg}/mid/other.py:1: import cycle: pkg.mid.other <-> pkg.mid.thing" in out
    assert f"    {pkg}/mid/thing.py:2: pkg.mid.thing imports pkg.mid.other" in out
    assert f"    {pkg}/mid/other.py:1: pkg.mid.other imports pkg.mid.thing" in out
    assert f"{pkg}/util/helper.py:5: pkg.util.helper imports pkg.mid.thing, a layer above it (mid > util)" in out
    assert f"{pkg}/mid/__init__.py:2: pkg.mid imports pkg.top, a layer above it (top > mid)" in out
    assert f"{pkg}/left.py:1: pkg.left imports pkg.right: left and right are independent" in out
    assert any(line.startswith("pkg.stray is in no layer") for line in out), text
    via_root = f"{pkg}/util/version.py:1: pkg.util.version imports pkg (its __init__ imports) pkg.mid"
    assert f"{via_root}, a layer above it (mid > util)" in out
    assert f"{via_root}.thing, a layer above it (mid > util)" in out
    # the 80-line functions (one decorated) and the 450-line module keep the rules
    assert "eighty:" not in text and "decorated" not in text and "size_ok" not in text
    assert out[-1] == "house rules: 9 breaches in 16 modules"


def test_the_projects_layers_are_read_from_the_import_linter_contract():
    sys.path.insert(0, str(CHECK.parent))
    try:
        import house_check
    finally:
        sys.path.remove(str(CHECK.parent))
    layers = house_check.read_layers(ROOT / "pyproject.toml")
    at = layers.index
    assert layers.container == "loopchat"
    assert at["cli"] < at["tui"] == at["serve"] < at["chat"] < at["history"] < at["backends"] < at["engine"]
    assert at["engine"] < at["events"] == at["config"] == at["settings"] == at["request"]
    assert layers.independent[at["tui"]] and not layers.independent[at["events"]]
