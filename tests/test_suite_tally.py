"""`make test`'s two pytest runs (the parallel part, then the `alone` part): the closing
line the Makefile prints for both (tests/suite_tally.py), and the guard that keeps CPU
burners out of the parallel part."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_burners import cpu_burners
from suite_tally import alone_files_left_out, alone_without_cost_marker

TALLY = Path(__file__).with_name("suite_tally.py")
#: CI's plain closing line: "N passed, N failed" alone on a line, ", N skipped" may follow,
#: one word with a colon may stand before it
CLOSING = re.compile(r"^(\w+: )?\d+ passed, \d+ failed(, \d+ skipped)?$")


def part(passed: int, failed: int = 0, skipped: int = 0, error: int = 0, exitstatus: int = 0) -> dict:
    return {"passed": passed, "failed": failed, "error": error, "skipped": skipped, "exitstatus": exitstatus}


def tally(tmp_path: Path, parts: list[dict], *codes: int) -> subprocess.CompletedProcess:
    path = tmp_path / "tally.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in parts))
    return subprocess.run(
        [sys.executable, str(TALLY), str(path), *map(str, codes)], capture_output=True, text=True, timeout=60
    )


def test_both_parts_passing_end_with_one_closing_line_for_the_suite(tmp_path: Path) -> None:
    done = tally(tmp_path, [part(850, skipped=2), part(7)], 0, 0)
    assert done.returncode == 0, done.stdout
    last = done.stdout.splitlines()[-1]
    assert last == "suite: 857 passed, 0 failed, 2 skipped" and CLOSING.match(last)


@pytest.mark.parametrize(
    ("parts", "codes", "why"),
    [
        ([part(850), part(6, failed=1, exitstatus=1)], (0, 1), "alone part (by itself): pytest exit 1 (failed)"),
        (
            [part(849, error=1, exitstatus=1), part(7)],
            (1, 0),
            "parallel part (xdist workers, not alone): pytest exit 1",
        ),
        ([part(850)], (0, 0), "2 pytest runs but 1 tallies"),  # a run killed before its summary
        ([part(0, exitstatus=5), part(0, exitstatus=5)], (5, 5), "no test passed"),
    ],
)
def test_either_part_failing_or_no_test_run_fails_the_suite(tmp_path: Path, parts, codes, why: str) -> None:
    done = tally(tmp_path, parts, *codes)
    assert done.returncode == 1, done.stdout
    assert why in done.stdout
    last = done.stdout.splitlines()[-1]
    assert CLOSING.match(last), last
    failed = sum(p["failed"] + p["error"] for p in parts)
    assert f" {failed} failed" in last


def test_cpu_burners_refuse_to_run_beside_another_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    with pytest.raises(RuntimeError, match="mark the test `alone`"):
        with cpu_burners(1, seconds=5):
            pass


class Item:
    def __init__(self, nodeid: str, *marks: str) -> None:
        self.nodeid, self.marks = nodeid, marks

    def get_closest_marker(self, name: str) -> str | None:
        return name if name in self.marks else None


def test_an_alone_test_must_also_be_a_model_or_slow_one() -> None:
    items = [Item("a", "alone", "model"), Item("b", "alone", "slow"), Item("c", "alone"), Item("d"), Item("e", "slow")]
    assert alone_without_cost_marker(items) == ["c"]


def test_a_file_with_an_alone_test_must_be_in_the_alone_part_s_list() -> None:
    items = [
        Item("tests/test_a.py::t1", "alone", "model"),
        Item("tests/test_a.py::t2"),
        Item("tests/test_b.py::t", "alone"),
    ]
    items.append(Item("tests/test_c.py::t", "model"))
    assert alone_files_left_out(items, "tests/test_a.py tests/test_b.py") == []
    assert alone_files_left_out(items, "tests/test_a.py tests/test_c.py") == ["tests/test_b.py"]
    assert alone_files_left_out(items, "") == ["tests/test_a.py", "tests/test_b.py"]
    assert alone_files_left_out(items, None) == []  # outside make test: not checked


def test_the_makefile_s_alone_files_are_the_files_with_alone_tests() -> None:
    """The alone part collects the Makefile's ALONE_FILES only: the list, as make computes
    it, is every test file that marks a test `alone` (the three that do today)."""
    root = Path(__file__).parent.parent
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "print-alone-files"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    listed = {Path(f).name for f in done.stdout.split()}
    assert {"test_auto_threads.py", "test_probe_guard.py", "test_thread_tuner.py"} <= listed
    marked = {p.name for p in root.glob("tests/test_*.py") if re.search(r"pytest\.mark\.alone", p.read_text("utf-8"))}
    assert listed == marked
