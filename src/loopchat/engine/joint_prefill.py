"""The prefills of the requests that join a shared run at one pass, in one batch (shared_batch.py).

Requests that arrive together would otherwise be prefilled one after another between two
passes, each its own `llama_decode`, the k-th waiting for k prefills before its first token.
Instead each joining request's ReplyRun.prefill runs as it always does (the longest prefix
reused, the rest chunked) with its SlotHost deferring the decode (`SlotHost.defer`: the tokens
queued at their positions), and `joint_prefill` then decodes every joining sequence's queued
tokens in one llama_batch (chunks of n_batch entries when they are more), the logits kept for
each sequence's last token and copied out (a later chunk's decode would overwrite them).

Each request's Prefill then says the joint decode: `ms` the whole decode's time (shared by the
requests that joined at that pass), `batches` its chunks; its `evaluated_tokens` and
`reused_tokens` stay its own. A decode that fails (or is aborted) fails the requests whose
tokens it had not all decoded; their cells are removed.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from loopchat.engine.run import ReplyRun
from loopchat.engine.slot_host import SlotHost
from loopchat.events import FinishReason, Prefill


def joint_prefill(
    engine: Any, prefill: Any, calls: Any, joining: list[tuple[SlotHost, ReplyRun, Prefill]]
) -> list[Prefill]:
    """Decode the queued prefill tokens of `joining` (host, run, its Prefill as run.prefill()
    made it) in one batch; returns each one's Prefill with the joint decode's figures."""
    entries: list[tuple[int, int, int, bool]] = []
    last: dict[int, int] = {}  # joining index -> the entry of its last token
    for k, (host, run, _) in enumerate(joining):
        host.defer = False
        if run.reason is not None or not host.pending:  # (cancelled during its prefill)
            continue
        n = len(host.pending)
        entries.extend((host.seq, t, host.pending_from + j, j == n - 1) for j, t in enumerate(host.pending))
        last[k] = len(entries) - 1
    t0 = time.perf_counter()
    batches, rc, failed_at = 0, 0, len(entries)
    for start in range(0, len(entries), prefill.size):
        chunk = entries[start : start + prefill.size]
        engine.passes += 1
        batches += 1
        rc = prefill.decode_entries(chunk)
        if rc != 0:
            failed_at = start
            break
        for k, at in last.items():
            if start <= at < start + len(chunk):
                joining[k][0].row = np.array(calls.row(at - start))  # (its own copy)
    ms = (time.perf_counter() - t0) * 1000.0
    out = []
    for k, (host, run, event) in enumerate(joining):
        if k in last:
            if last[k] >= failed_at:
                _fail(host, run, rc)
            run.clock.prefill_ms = run.clock.forward_ms = ms
            run.clock.forward_tokens = len(entries)
            event = dataclasses.replace(event, ms=ms, batches=batches)
        host.pending.clear()
        out.append(event)
    return out


def _fail(host: SlotHost, run: ReplyRun, rc: int) -> None:
    """The joint decode failed before this sequence's tokens were all in: its cells leave."""
    start = host.pending_from
    host.keep_cached(start)
    host.row = None
    run.reason = FinishReason.CANCELLED if rc == 2 else FinishReason.ERROR
    run.error = None if rc == 2 else f"llama.cpp failed to decode: llama_decode returned {rc}"
