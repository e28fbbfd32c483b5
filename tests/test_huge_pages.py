"""The model read into 2 MB pages (engine/huge_pages.py): on Linux the GGUF file is read, not
mapped, its weights and KV cache land in 2 MB pages, and the logits are the very bits of llama.cpp's
own mapping of the file; LOOPCHAT_HUGE_PAGES=0 (or a file too large for the memory) keeps the
mapping."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest

from loopchat.engine import huge_pages
from loopchat.engine.llama_load import load_llama

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="2 MB pages: Linux only")


def _huge_bytes() -> int:
    """The process's anonymous memory in 2 MB pages."""
    with open("/proc/self/smaps_rollup", encoding="ascii") as f:
        line = next(ln for ln in f if ln.startswith("AnonHugePages:"))
    return int(line.split()[1]) * 1024


def _thp_off() -> bool:
    """Whether the system's transparent huge pages are off (`never`)."""
    try:
        return "[never]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return True


def _maps(path: Path) -> int:
    """How many of the process's mappings are the file's."""
    with open("/proc/self/maps", encoding="ascii") as f:
        return sum(line.rstrip().endswith(str(path.resolve())) for line in f)


def _load(path: Path, huge: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[object, int, int]:
    """(the Llama, the bytes it added in 2 MB pages, the mappings of the file it added)."""
    monkeypatch.setenv("LOOPCHAT_HUGE_PAGES", "1" if huge else "0")
    before, maps = _huge_bytes(), _maps(path)
    llm = load_llama(path, 512, 512, 1, 0, None, False)
    return llm, _huge_bytes() - before, _maps(path) - maps


def _last_logits(llm: object, tokens: list[int]) -> np.ndarray:
    llm.eval(tokens)  # type: ignore[attr-defined]
    return np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)  # type: ignore[attr-defined]


def test_the_weights_land_in_2mb_pages_with_the_same_logits(model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mapped_llm, mapped_huge, mapped = _load(model_path, False, monkeypatch)
    read_llm, read_huge, still_mapped = _load(model_path, True, monkeypatch)
    weights = llama_cpp.llama_model_size(read_llm.model)  # type: ignore[attr-defined]
    assert mapped > 0 and mapped_llm.huge_pages_mb == 0 and mapped_huge < weights // 10  # type: ignore[attr-defined]
    assert still_mapped == 0  # (read into memory of its own: no map of the file left after the load)
    if _thp_off():  # (the system gives no 2 MB pages: none, and said so)
        assert read_huge == 0 and read_llm.huge_pages_mb == 0  # type: ignore[attr-defined]
    else:
        assert read_huge >= 0.9 * weights, (read_huge, weights)
        # (what the load counted; khugepaged may have moved some of the KV cache since)
        assert 0.9 * weights <= read_llm.huge_pages_mb * 2**20 <= read_huge + 2**20  # type: ignore[attr-defined]
    tokens = mapped_llm.tokenize(b"The lighthouse keeper looked at the storm and")  # type: ignore[attr-defined]
    a, b = _last_logits(mapped_llm, tokens), _last_logits(read_llm, tokens)
    assert a.tobytes() == b.tobytes()  # the same bits: only the page tables differ
    mapped_llm.close()  # type: ignore[attr-defined]
    read_llm.close()  # type: ignore[attr-defined]


def test_the_environment_or_a_file_too_large_for_the_memory_keeps_the_map(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOPCHAT_HUGE_PAGES", raising=False)
    assert huge_pages.wanted(100 << 20)
    assert not huge_pages.wanted(1 << 50)  # (a read copy cannot be paged back to the file)
    monkeypatch.setenv("LOOPCHAT_HUGE_PAGES", "0")
    assert not huge_pages.wanted(100 << 20)
    with huge_pages.loading(False) as pages:
        pass
    assert pages == [0]


def test_the_trace_s_start_event_says_how_much_was_in_2mb_pages(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopchat.engine.engine import Engine
    from loopchat.event_json import to_json_dict
    from loopchat.events import Message, Start
    from loopchat.settings import SamplingSettings

    asked = [Message("user", "Hi")]
    for huge in (True, False):
        monkeypatch.setenv("LOOPCHAT_HUGE_PAGES", "1" if huge else "0")
        engine = Engine(model_path, n_ctx=512, threads=1, warmup=False)
        try:
            start = next(
                e for e in engine.generate(asked, SamplingSettings(seed=1, max_tokens=2)) if isinstance(e, Start)
            )
        finally:
            engine.close()
        assert start.huge_pages_mb == engine.huge_pages_mb
        assert to_json_dict(start)["huge_pages_mb"] == start.huge_pages_mb  # (0 is written: the file was mapped)
        assert (start.huge_pages_mb > 0) == (huge and not _thp_off()), start.huge_pages_mb


def test_loopchat_run_reads_the_model_into_2mb_pages_and_writes_the_same_reply(tmp_path: Path) -> None:
    """The command as a user runs it (no LOOPCHAT_HUGE_PAGES: the suite's conftest maps the file for
    speed, so it is removed here): the trace's start event says the model is in 2 MB pages, and the
    reply is the mapped file's, token for token."""
    import subprocess

    from loopchat.trace import read_trace

    def run(huge: bool) -> tuple[str, list[Any]]:
        env = {k: v for k, v in os.environ.items() if k != "LOOPCHAT_HUGE_PAGES"}
        if not huge:
            env["LOOPCHAT_HUGE_PAGES"] = "0"
        trace = tmp_path / f"{huge}.jsonl"
        args = ["run", "--seed", "3", "--max-tokens", "12", "--temperature", "1", "--trace", str(trace), "Name a sea."]
        proc = subprocess.run(
            [sys.executable, "-m", "loopchat", *args], capture_output=True, text=True, env=env, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout, [t.event for t in read_trace(trace)[1]]

    (out_huge, huge), (out_mapped, mapped) = run(True), run(False)
    start_huge, start_mapped = (next(e for e in t if e.kind == "start") for t in (huge, mapped))
    assert start_mapped.huge_pages_mb == 0  # type: ignore[union-attr]
    assert (start_huge.huge_pages_mb > 0) != _thp_off(), start_huge  # type: ignore[union-attr,operator]
    steps = [[(e.token_id, e.raw_prob, e.sampled_prob) for e in t if e.kind == "step"] for t in (huge, mapped)]
    assert steps[0] == steps[1] and len(steps[0]) == 12
    assert out_huge.splitlines()[0] == out_mapped.splitlines()[0]
