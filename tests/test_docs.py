"""The README stays a two-minute read, and every link in it and in docs/ leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_at_most_10_kb() -> None:
    assert len((ROOT / "README.md").read_bytes()) <= 10 * 1024


def _local_links(doc: Path) -> list[tuple[str, Path]]:
    out = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if "://" in target or target.startswith("#"):
            continue
        out.append((target, (doc.parent / target.split("#", 1)[0]).resolve()))
    return out


def test_every_local_link_in_the_readme_and_docs_names_a_file_that_exists() -> None:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    checked = 0
    for doc in docs:
        for target, path in _local_links(doc):
            assert path.exists(), f"{doc.name}: {target}"
            checked += 1
    assert checked >= 20  # the README alone links a dozen docs


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("see [there](missing.md) and [here](x.md#top)", encoding="utf-8")
    assert [p.exists() for _, p in _local_links(doc)] == [False, True]
