#!/usr/bin/env python3
"""The house rules of src/loopchat, checked by `make lint` (and so by `make test`):

- no function over 80 lines (from its `def` line to its last line, decorators not counted;
  nested functions and methods are measured too);
- no module over 450 lines (newline characters in the file);
- no import cycle between loopchat modules (imports inside functions and under
  `if TYPE_CHECKING:` count: they are imports all the same);
- no import climbs a layer: a module imports only from its own layer or the layers below
  it, and not from a sibling in a `|` layer. The layers are read from the import-linter
  contract in pyproject.toml (`[tool.importlinter]`, the contract of type "layers"), the one
  place that names them; every top-level module or package must be in one.

Measured the same way as the house check the issues quote (functions, modules and cycles);
the layer rule is the one `lint-imports` checks, here for direct imports with their line.

    .venv/bin/python tools/house_check.py [SRC_PACKAGE_DIR] [--pyproject FILE]

Prints every breach on its own line as `file:line: what` and exits 1 if there is any;
prints a one-line summary and exits 0 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import re
import sys
import tomllib
from dataclasses import dataclass, field

FN_MAX, MOD_MAX = 80, 450


@dataclass
class Module:
    name: str
    path: pathlib.Path
    lines: int
    functions: list[tuple[int, str, int]] = field(default_factory=list)  # (line, name, length)
    imports: list[tuple[int, str]] = field(default_factory=list)  # (line, imported name)


@dataclass(frozen=True)
class Layers:
    """Which layer each top-level child of the container is in (0 = the top)."""

    container: str
    index: dict[str, int]
    independent: dict[int, bool]

    def of(self, module: str) -> str | None:
        """The top-level child of the container that `module` belongs to, or None for the root."""
        parts = module.split(".")
        if parts[0] != self.container or len(parts) < 2:
            return None
        return parts[1]


def module_name(path: pathlib.Path, src_root: pathlib.Path) -> str:
    parts = list(path.relative_to(src_root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imported(node: ast.Import | ast.ImportFrom, package: str, top: str) -> list[str]:
    """The loopchat names an import statement brings in: the module and, for `from m import a`,
    also `m.a` (a submodule when one of that name exists)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == top]
    if node.level:
        base = package.split(".")
        base = base[: len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    if mod.split(".")[0] != top:
        return []
    return [mod] + [f"{mod}.{a.name}" for a in node.names]


def scan(root: pathlib.Path) -> dict[str, Module]:
    """Every module under the package directory `root`, measured."""
    src_root = root.parent
    modules: dict[str, Module] = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        name = module_name(path, src_root)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        mod = Module(name, path, text.count("\n"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                end = node.end_lineno if node.end_lineno is not None else node.lineno
                mod.functions.append((node.lineno, node.name, end - node.lineno + 1))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                mod.imports.extend((node.lineno, n) for n in _imported(node, package, root.name))
        modules[name] = mod
    return modules


def edges(modules: dict[str, Module]) -> dict[str, dict[str, int]]:
    """module -> {imported loopchat module: the line of its first import}."""
    graph: dict[str, dict[str, int]] = {}
    for name, mod in modules.items():
        out: dict[str, int] = {}
        for line, target in sorted(mod.imports):
            if target in modules and target != name:
                out.setdefault(target, line)
        graph[name] = out
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10000))
    try:
        for v in graph:
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def read_layers(pyproject: pathlib.Path) -> Layers:
    """The layers of the import-linter contract of type "layers" in `pyproject`."""
    config = tomllib.loads(pyproject.read_text())
    contracts = config.get("tool", {}).get("importlinter", {}).get("contracts", [])
    found = [c for c in contracts if c.get("type") == "layers"]
    if len(found) != 1 or len(found[0].get("containers", [])) != 1:
        raise SystemExit(f"{pyproject}: expected one import-linter contract of type 'layers' with one container")
    contract = found[0]
    index: dict[str, int] = {}
    independent: dict[int, bool] = {}
    for i, layer in enumerate(contract["layers"]):
        names = [n.strip() for n in re.split(r"[|:]", layer)]
        independent[i] = ":" not in layer
        index.update((n, i) for n in names if n)
    return Layers(contract["containers"][0], index, independent)


def size_breaches(modules: dict[str, Module]) -> list[str]:
    out = []
    for mod in modules.values():
        if mod.lines > MOD_MAX:
            out.append(f"{mod.path}:1: module {mod.name}: {mod.lines} lines (max {MOD_MAX})")
        for line, fn, n in mod.functions:
            if n > FN_MAX:
                out.append(f"{mod.path}:{line}: function {fn}: {n} lines (max {FN_MAX})")
    return out


def cycle_breaches(modules: dict[str, Module], graph: dict[str, dict[str, int]]) -> list[str]:
    """One breach per cycle, followed by the imports that close it (each with its line)."""
    out = []
    for comp in cycles(graph):
        members = set(comp)
        links = [
            f"\n    {modules[m].path}:{line}: {m} imports {t}"
            for m in comp
            for t, line in sorted(graph[m].items())
            if t in members
        ]
        first = modules[comp[0]]
        out.append(f"{first.path}:1: import cycle: {' <-> '.join(comp)}" + "".join(links))
    return out


def _through_root(targets: dict[str, int], graph: dict[str, dict[str, int]], root: str) -> list[tuple[str, int, str]]:
    """(imported module, line, how) for each import; an import of the package root itself
    (`from loopchat import x`) brings in what the root's __init__ imports, as lint-imports sees it."""
    out: list[tuple[str, int, str]] = []
    for target, line in sorted(targets.items(), key=lambda t: t[1]):
        if target == root:
            out.extend((t, line, f"{root} (its __init__ imports) ") for t in sorted(graph.get(root, {})))
        else:
            out.append((target, line, ""))
    return out


def layer_breaches(modules: dict[str, Module], graph: dict[str, dict[str, int]], layers: Layers) -> list[str]:
    """Imports that climb a layer or cross between independent siblings, and modules in no layer."""
    out = []
    unplaced: set[str] = set()
    for name, targets in graph.items():
        here = layers.of(name)
        if here is None:
            continue
        if here not in layers.index:
            unplaced.add(here)
            continue
        for target, line, via in _through_root(targets, graph, layers.container):
            there = layers.of(target)
            if there is None or there == here or there not in layers.index:
                continue
            mine, theirs = layers.index[here], layers.index[there]
            if theirs < mine:
                out.append(
                    f"{modules[name].path}:{line}: {name} imports {via}{target}, a layer above it ({there} > {here})"
                )
            elif theirs == mine and layers.independent[mine]:
                out.append(
                    f"{modules[name].path}:{line}: {name} imports {via}{target}: {here} and {there} are independent"
                )
    for child in sorted(unplaced):
        out.append(
            f"{layers.container}.{child} is in no layer: add it to the layers contract in pyproject.toml "
            "([tool.importlinter])"
        )
    return out


def check(root: pathlib.Path, pyproject: pathlib.Path) -> tuple[list[str], int]:
    """Every breach under the package directory `root`, and how many modules were read."""
    modules = scan(root)
    graph = edges(modules)
    breaches = size_breaches(modules) + cycle_breaches(modules, graph)
    breaches += layer_breaches(modules, graph, read_layers(pyproject))
    return breaches, len(modules)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The house rules of src/loopchat.")
    parser.add_argument("root", nargs="?", default="src/loopchat", help="the package directory")
    parser.add_argument("--pyproject", default="pyproject.toml", help="where the layers contract is")
    args = parser.parse_args(argv)
    breaches, n = check(pathlib.Path(args.root), pathlib.Path(args.pyproject))
    for b in breaches:
        print(b)
    if breaches:
        print(f"house rules: {len(breaches)} breaches in {n} modules")
        return 1
    print(
        f"house rules hold: {n} modules, functions <= {FN_MAX} lines, modules <= {MOD_MAX}, no import cycles, no climbs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
