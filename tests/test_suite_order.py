"""The order in which `make test`'s workers take the files (tests/suite_order.py): the
longest files first, each file's tests together and in their order."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from suite_order import COST_S, ordered
from suite_tally import ENV as TALLY_ENV

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Item:
    nodeid: str


def test_the_costly_files_come_first_then_the_others_by_number_of_tests() -> None:
    costly = sorted(COST_S, key=lambda f: -COST_S[f])[:2]
    ids = [
        "tests/test_short_a.py::t1",
        "tests/test_short_b.py::t1",
        "tests/test_short_b.py::t2",
        f"{costly[1]}::t1",
        f"{costly[0]}::t1",
        f"{costly[0]}::t2[x]",
        "tests/test_short_a.py::t2",  # (a file's tests apart in the input stay in their order)
    ]
    got = [i.nodeid for i in ordered([Item(n) for n in ids])]
    assert got == [
        f"{costly[0]}::t1",
        f"{costly[0]}::t2[x]",
        f"{costly[1]}::t1",
        "tests/test_short_a.py::t1",  # two tests each: collection order
        "tests/test_short_a.py::t2",
        "tests/test_short_b.py::t1",
        "tests/test_short_b.py::t2",
    ]


def test_every_file_named_exists() -> None:
    assert [f for f in COST_S if not (ROOT / f).is_file()] == []


@pytest.mark.slow  # a pytest process collecting two files: ~3 s of CPU
def test_make_test_keeps_the_order_and_pytest_collects_in_it() -> None:
    assert "--no-loadscope-reorder" in next(
        line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("PYTEST_PARALLEL :=")
    )
    # conftest.py applies it: the costly file first though named last, each file's tests together
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["tests/test_suite_tally.py", "tests/test_speculative.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != TALLY_ENV},  # not a run of make test's tally
    )
    files = [line.split("::")[0] for line in out.stdout.splitlines() if "::" in line]
    assert files and files[0] == "tests/test_speculative.py", out.stdout[-2000:]
    assert files == sorted(files, key=lambda f: f != "tests/test_speculative.py")
