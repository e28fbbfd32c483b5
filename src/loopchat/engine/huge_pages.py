"""The model in 2 MB pages (Linux). A forward pass streams every weight (~100-250 MB on the test
models) through the TLB; in 4 KB pages that is a miss every 4 KB, in 2 MB pages one every 2 MB:
1,024-token replies decoded 1.07-1.17x as fast here (docs/performance.md, "The weights in 2 MB
pages"). The bytes are the same at the same addresses, only the page tables differ: every logit
is the same, bit for bit (tests/test_huge_pages.py).

llama.cpp maps the GGUF file by default, and a file's shared mapping comes in 4 KB pages (ext4's
page cache gives no larger ones). So the file is read instead (`use_mmap=False`), into anonymous
memory: at llama.cpp's first progress callback, its weight buffers made but not yet read into, they
are advised MADV_HUGEPAGE, so each 2 MB stretch the read writes first comes as one 2 MB page (no copy,
512x fewer page faults). The context's buffers (the KV cache, zeroed in 4 KB pages as they are made)
are advised after the load, and a thread of their own collapses their resident stretches into 2 MB
pages (MADV_COLLAPSE, Linux 6.1+: 34-286 ms of copying for the default model's 4,096-token cache, not
in the load's time; the attention reads the cache every pass: without it the default model's pass
gained nothing). Where the kernel gives no 2 MB page (THP off, none free) the memory stays in 4 KB
pages: only slower. Not done where the file is larger than half the memory available (a read copy
cannot be dropped and read again from the file as a mapping's pages can), nor off Linux, nor with
`LOOPCHAT_HUGE_PAGES=0` in the environment (llama.cpp's own mapping: a benchmark's "before").
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # (linux/mman.h; MADV_COLLAPSE: Linux 6.1)
_HUGE = 2 << 20
_ROLLUP = "/proc/self/smaps_rollup"  # (AnonHugePages: the process's memory in 2 MB pages)


def wanted(file_size: int) -> bool:
    """Read the model into 2 MB pages: on Linux, a file of at most half the memory available,
    unless LOOPCHAT_HUGE_PAGES=0."""
    if sys.platform != "linux" or os.environ.get("LOOPCHAT_HUGE_PAGES", "1") == "0":
        return False
    return 2 * file_size <= proc_bytes("/proc/meminfo", "MemAvailable")


def proc_bytes(path: str, field: str) -> int:
    """A `Field:   N kB` line of a /proc file (meminfo, smaps_rollup) in bytes (0: unknown)."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _anonymous() -> frozenset[tuple[int, int]]:
    """The process's anonymous read-write mappings now, as (start, end)."""
    try:
        with open("/proc/self/maps", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return frozenset()
    out = set()
    for line in lines:
        parts = line.split()
        if len(parts) == 5 and parts[1].startswith("rw"):  # (no path: not a file, [heap] or [stack])
            lo, hi = parts[0].split("-")
            out.add((int(lo, 16), int(hi, 16)))
    return frozenset(out)


def _madvise() -> Any:
    """The C library's madvise, or None where it has none."""
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


def _inside(lo: int, hi: int) -> range:
    """The 2 MB-aligned stretches inside [lo, hi), by their starts."""
    return range((lo + _HUGE - 1) & ~(_HUGE - 1), hi & ~(_HUGE - 1), _HUGE)


def _advise(before: frozenset[tuple[int, int]]) -> None:
    """MADV_HUGEPAGE over the anonymous mappings made since `before`: a page first written there
    comes as a 2 MB page."""
    madvise = _madvise()
    for lo, hi in sorted(_anonymous() - before) if madvise else ():
        starts = _inside(lo, hi)
        if len(starts):
            madvise(starts[0], len(starts) * _HUGE, MADV_HUGEPAGE)


def _collapse(before: frozenset[tuple[int, int]]) -> None:
    """MADV_COLLAPSE (Linux 6.1+) over each wholly resident 2 MB stretch of the anonymous mappings
    made since `before` (one not wholly resident is left: collapsing it would fill it): the KV
    cache, zeroed in 4 KB pages as llama.cpp made it. On a thread of its own after the load, at the
    lowest priority (a mapping freed meanwhile only makes a call fail)."""
    with contextlib.suppress(OSError, AttributeError):  # (the lowest priority: the first passes go first)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    madvise = _madvise()
    try:
        mincore = ctypes.CDLL(None, use_errno=True).mincore
    except (OSError, AttributeError):
        return
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    vec = (ctypes.c_ubyte * (_HUGE // 4096))()
    for lo, hi in sorted(_anonymous() - before) if madvise else ():
        for at in _inside(lo, hi):
            if mincore(at, _HUGE, vec) == 0 and all(b & 1 for b in vec):
                madvise(at, _HUGE, MADV_COLLAPSE)


@contextmanager
def loading(on: bool) -> Iterator[list[int]]:
    """Around a `Llama`'s creation on this thread (one load at a time: flash_attn.py's lock is held
    around it): where `on`, its model gets a progress callback that advises the weights' buffers at
    its first call; after it the context's are advised and, on a thread, collapsed. Yields a list whose one item is, after
    the block, how many MB more of the process's memory are in 2 MB pages (0 where not `on`)."""
    out = [0]
    if not on:
        yield out
        return
    from llama_cpp import _internals, llama_cpp

    original = _internals.LlamaModel
    before, huge_before = _anonymous(), proc_bytes(_ROLLUP, "AnonHugePages")
    advised: list[bool] = []

    def progress(_done: float, _data: Any) -> bool:
        if not advised:  # (the first call: every buffer made, no tensor read yet)
            advised.append(True)
            try:
                _advise(before)
            except Exception:  # noqa: BLE001 (a callback that raised would return False: the load ended)
                pass
        return True

    callback = llama_cpp.llama_progress_callback(progress)

    def create(*, path_model: str, params: Any, verbose: bool = True) -> Any:
        params.progress_callback = callback
        return original(path_model=path_model, params=params, verbose=verbose)

    _internals.LlamaModel = create  # type: ignore[assignment,misc]
    try:
        yield out
    finally:
        _internals.LlamaModel = original  # type: ignore[misc]
    _advise(before)  # (the context's buffers too: their pages yet to come as 2 MB ones)
    out[0] = max(0, proc_bytes(_ROLLUP, "AnonHugePages") - huge_before) >> 20
    threading.Thread(target=_collapse, args=(before,), name="loopchat-huge-pages", daemon=True).start()
