"""`make test` runs the suite in two pytest invocations: the parallel part (xdist, the
tests not marked `alone`), then the `alone` part by itself (the tests that measure the
machine's load). Each invocation appends its counts to the file named by
LOOPCHAT_SUITE_TALLY (conftest.py's pytest_terminal_summary calls `record`); then
`python tests/suite_tally.py FILE EXIT_PARALLEL EXIT_ALONE` prints one closing line for the
whole suite, `suite: N passed, N failed, N skipped`, and exits non-zero when either part
failed, one part left no counts, or no test passed at all (a run that "passed" with no test
is a failure)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

ENV = "LOOPCHAT_SUITE_TALLY"
#: pytest's outcome categories, as its closing line counts them
KINDS = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "deselected")


def record(terminalreporter: Any, exitstatus: int | pytest.ExitCode, config: pytest.Config) -> None:
    """Append this invocation's counts to the tally file (the xdist controller only: a
    worker's reports reach the controller's terminal reporter, which counts them all)."""
    path = os.environ.get(ENV)
    if not path or hasattr(config, "workerinput"):
        return
    counts = {kind: len(terminalreporter.stats.get(kind, [])) for kind in KINDS}
    counts["exitstatus"] = int(exitstatus)
    counts["markexpr"] = config.getoption("markexpr") or ""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(counts) + "\n")


def alone_without_cost_marker(items: list[Any]) -> list[str]:
    """The `alone` tests that carry neither `model` nor `slow`: `make test-fast` deselects
    only those markers (and `server`), so such a test would run there, beside nothing to
    keep it alone from but still measuring a machine it does not own."""
    return [
        item.nodeid
        for item in items
        if item.get_closest_marker("alone") and not any(item.get_closest_marker(m) for m in ("model", "slow"))
    ]


#: the files `make test`'s alone part collects (the Makefile's ALONE_FILES, space-separated):
#: collecting only those, not all ~1,070 tests to deselect all but 5, saves ~5 s of the serial part
ALONE_FILES_ENV = "LOOPCHAT_ALONE_FILES"


def alone_files_left_out(items: list[Any], listed: str | None) -> list[str]:
    """The files with an `alone` test that the alone part would not collect (`listed`: the
    Makefile's ALONE_FILES; None outside `make test`, where nothing is checked). The parallel
    part deselects every `alone` test, so a file missing from the list would run its `alone`
    tests nowhere."""
    if listed is None:
        return []
    wanted = {Path(f).name for f in listed.split()}
    files = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("alone")}
    return sorted(f for f in files if Path(f).name not in wanted)


def closing_line(parts: list[dict[str, Any]]) -> str:
    """The plain closing line CI reads (errors count as failed); nothing may follow it."""
    total = {kind: sum(int(p.get(kind, 0)) for p in parts) for kind in KINDS}
    return f"suite: {total['passed']} passed, {total['failed'] + total['error']} failed, {total['skipped']} skipped"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python tests/suite_tally.py TALLY_FILE EXIT_PARALLEL EXIT_ALONE", file=sys.stderr)
        return 2
    path, codes = Path(argv[0]), [int(c) for c in argv[1:]]
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    parts = [json.loads(line) for line in text.splitlines() if line.strip()]
    names = ("parallel part (xdist workers, not alone)", "alone part (by itself)")
    for name, code in zip(names, codes):
        print(f"{name}: pytest exit {code}{'' if code == 0 else ' (failed)'}")
    problems = []
    if len(parts) != len(codes):
        problems.append(f"{len(codes)} pytest runs but {len(parts)} tallies (a run ended before its summary)")
    if sum(int(p["passed"]) for p in parts) == 0:
        problems.append("no test passed")
    for problem in problems:
        print(f"make test: {problem}")
    print(closing_line(parts))
    return 1 if problems or any(codes) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
