"""Textual's private API is used in tui/render/ only, and the app runs without it.

1. The source outside tui/render/ imports no private Textual or rich module and touches
   no private name of Textual or rich: neither on a Textual object (`self.app._x`,
   `hover._link_id`) nor, in a subclass of a Textual class, on itself (reading,
   assigning or overriding a name its Textual bases define, `super()._on_key`). Our own
   private names are fine. The checker is shown to catch each kind on a sample, and
   the real uses inside tui/render/.
2. The version guard: with LOOPCHAT_STOCK_RENDER=1, or on a Textual other than the tested
   one, the app starts on Textual's stock rendering with a one-line notice, and
   behaves the same (the fast TUI tests run that way too: tests/test_render_fallback.py);
   a Textual without the private names fails over the same way instead of crashing.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import rich
import textual

import loopchat
from loopchat.tui import render

SRC = Path(loopchat.__file__).parent
RENDER = SRC / "tui" / "render"
LIBS = ("textual", "rich")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@functools.cache
def library_private_names() -> frozenset[str]:
    """Every private attribute or method name the Textual and rich sources define."""
    names: set[str] = set()
    pattern = re.compile(r"\b(?:self|cls)\.(_[A-Za-z]\w*)|\bdef (_[A-Za-z]\w*)")
    for lib in (textual, rich):
        for path in Path(lib.__file__).parent.rglob("*.py"):
            for m in pattern.finditer(path.read_text(encoding="utf-8")):
                names.add(m.group(1) or m.group(2))
    return frozenset(n for n in names if _private(n))


@functools.cache
def class_private_names(cls: type) -> frozenset[str]:
    """The private names a Textual or rich class defines: in its body, and assigned to
    `self` in its methods."""
    names = {n for n in vars(cls) if _private(n)}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        tree = None
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            if _private(node.attr):
                names.add(node.attr)
    return frozenset(names)


def inherited_private_names(cls: object) -> frozenset[str]:
    """The private names of the Textual and rich classes `cls` derives from."""
    if not isinstance(cls, type):
        return frozenset()
    out: set[str] = set()
    for base in cls.__mro__:
        if base.__module__.split(".")[0] in LIBS:
            out |= class_private_names(base)
    return frozenset(out)


def _other_module(value: ast.AST, namespace: dict) -> bool:
    """`value` names a module of neither library (e.g. `os` in `os._exit`): its private
    names are its own, whatever Textual or rich happen to call theirs."""
    module = namespace.get(value.id) if isinstance(value, ast.Name) else None
    return isinstance(module, types.ModuleType) and module.__name__.split(".")[0] not in LIBS


def violations(source: str, namespace: dict, where: str = "") -> list[str]:
    """Uses of private Textual or rich API in `source` (its classes looked up in
    `namespace`, the module's globals, to know their bases)."""
    tree = ast.parse(source)
    found: list[str] = []
    foreign = library_private_names()

    def report(node: ast.AST, what: str) -> None:
        found.append(f"{where}:{getattr(node, 'lineno', '?')}: {what}")

    def visit(node: ast.AST, own: frozenset[str]) -> None:
        if isinstance(node, ast.ClassDef):
            own = inherited_private_names(namespace.get(node.name))
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in own:
                    report(item, f"overrides {node.name}.{item.name} of Textual/rich")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in LIBS and any(_private(p) for p in parts[1:]):
                    report(node, f"imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[0] in LIBS and (any(_private(p) for p in parts[1:]) or any(_private(a.name) for a in node.names)):
                report(node, f"imports from {node.module}")
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            value = node.value
            on_self = isinstance(value, ast.Name) and value.id in ("self", "cls")
            on_super = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"
            if on_self or on_super:
                if node.attr in own:
                    report(node, f"{ast.unparse(node)} (a private name of its Textual base)")
            elif node.attr in foreign and not _other_module(value, namespace):
                report(node, f"{ast.unparse(node)} (a private Textual/rich name)")
        for child in ast.iter_child_nodes(node):
            visit(child, own)

    visit(tree, frozenset())
    return found


def module_violations(path: Path) -> list[str]:
    name = "loopchat." + ".".join(path.relative_to(SRC).with_suffix("").parts)
    name = name.removesuffix(".__init__")
    module = importlib.import_module(name)
    return violations(path.read_text(encoding="utf-8"), vars(module), str(path.relative_to(SRC.parent)))


def outside_render() -> list[Path]:
    return [p for p in sorted(SRC.rglob("*.py")) if RENDER not in p.parents]


@pytest.mark.slow
def test_no_private_textual_api_outside_tui_render() -> None:
    files = outside_render()
    assert SRC / "tui" / "transcript.py" in files and len(files) > 20
    problems = [v for path in files for v in module_violations(path)]
    assert problems == []


def test_the_check_sees_the_private_api_inside_tui_render() -> None:
    found = "\n".join(v for path in sorted(RENDER.glob("*.py")) for v in module_violations(path))
    for use in (
        "textual._compositor",
        "textual._segment_tools",
        "_link_id",
        "_scroll_update",
        "_anchor_released",
        "_start_widget",
        "_vertical_scrollbar",
        "_dirty_regions",
    ):
        assert use in found, use


def test_the_check_catches_each_kind_of_use() -> None:
    sample = textwrap.dedent("""
        import os
        from textual._compositor import Compositor
        import textual._segment_tools
        from textual.widget import Widget
        from textual.widgets import TextArea


        class Prompt(TextArea):
            def __init__(self) -> None:
                super().__init__()
                self._mine = 1                       # our own name: fine

            async def _on_key(self, event) -> None:  # overrides TextArea._on_key
                await super()._on_key(event)

            def grow(self) -> None:
                self._anchor_released = False        # Widget's own state
                self.app._start_widget(self, self)   # a private App method


        def link(widget: Widget) -> bool:
            return bool(widget.hover_style._link_id)


        def leave(app) -> None:
            app._exit_renderables.clear()            # a private App name
            os._exit(0)                              # os's own: not Textual's _exit
        """)
    namespace: dict = {}
    exec(compile(sample, "sample", "exec"), namespace)
    found = violations(sample, namespace, "sample")
    for what in (
        "imports from textual._compositor",
        "imports textual._segment_tools",
        "overrides Prompt._on_key",
        "super()._on_key",
        "self._anchor_released",
        "self.app._start_widget",
        "widget.hover_style._link_id",
        "app._exit_renderables",
    ):
        assert any(what in v for v in found), (what, found)
    assert not any("_mine" in v or "os._exit" in v for v in found)
    assert len(found) == 8, found


def test_no_module_state_in_the_tui() -> None:
    """Caches live on the widgets: nothing in tui/ rebinds a module global."""
    uses = [
        f"{path.name}:{node.lineno}"
        for path in sorted((SRC / "tui").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Global)
    ]
    assert uses == []


# --------------------------------------------------------------------- the guard ----
def test_the_tested_textual_is_the_pinned_one(monkeypatch) -> None:
    pyproject = (SRC.parent.parent / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"textual=={render.TESTED_TEXTUAL}"' in pyproject
    assert render.textual_version() == render.TESTED_TEXTUAL  # the venv runs the pin
    monkeypatch.delenv(render.STOCK_ENV, raising=False)
    assert render.fallback_reason() is None and render.fast()  # the private API loaded
    assert all(m is not None for m in (render.compositor, render.lines, render.scrollbar, render.scrolling))


def test_the_guard_says_why_it_falls_back(monkeypatch) -> None:
    monkeypatch.setenv(render.STOCK_ENV, "1")
    assert render.fallback_reason() == "LOOPCHAT_STOCK_RENDER=1: using Textual's stock rendering (slower)"
    assert not render.fast() and type(render.default_screen()) is textual.screen.Screen
    monkeypatch.setenv(render.STOCK_ENV, "0")
    assert render.fast() and isinstance(render.default_screen(), render.compositor.LoopScreen)
    monkeypatch.setattr(textual, "__version__", "8.3.0", raising=False)
    assert render.fallback_reason() == "Textual 8.3.0 is not the tested 8.2.8: using Textual's stock rendering (slower)"
    assert not render.fast() and type(render.default_screen()) is textual.screen.Screen


#: how a future Textual could lack what tui/render/ imports, made real in a fresh process
#: (after Textual itself has loaded: it keeps working)
_MISSING = {
    "line_pad": "import textual.app, textual._segment_tools as m; del m.line_pad",
    "_compositor": "import sys, textual.app; sys.modules['textual._compositor'] = None",
}


@pytest.mark.slow
@pytest.mark.parametrize("missing", sorted(_MISSING))
def test_a_textual_without_the_private_api_falls_back_instead_of_crashing(missing: str) -> None:
    """The guard says what is missing, and the app starts and streams a reply on the
    stock paths with the notice on screen."""
    script = textwrap.dedent(f"""
        import asyncio, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        {_MISSING[missing]}
        from loopchat.tui import render
        print(render.fallback_reason())
        from tui_fixtures import FakeBackend, reply_to
        from loopchat.tui.app import LoopChatApp
        from loopchat.chat.prefs import Prefs

        async def main():
            app = LoopChatApp(FakeBackend(), prefs=Prefs(markdown=False), prefs_path=None)
            async with app.run_test(size=(100, 30)) as pilot:
                await reply_to(pilot, "hi")
                print(type(app.screen).__name__, "|", app.conversation.replies[-1].text)
                print([n.message for n in app.notices])

        asyncio.run(main())
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reason, shown, notices = proc.stdout.strip().splitlines()[-3:]
    assert reason.startswith("Textual 8.2.8 lacks the private API loopchat draws with ("), reason
    assert missing in reason and reason.endswith("): using Textual's stock rendering (slower)"), reason
    assert shown == "Screen | Hello, world! How are you?"
    assert repr(reason) in notices
