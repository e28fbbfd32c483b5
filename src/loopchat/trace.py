"""Trace files: one JSON object per line, one line per event (docs/trace-format.md).

The first line is a header with the schema version; every event line carries `t_ms`,
the milliseconds since the trace was opened, so a replay can keep the recorded pace.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from loopchat.errors import one_line
from loopchat.event_json import event_from_json_dict, to_json_dict
from loopchat.events import SCHEMA_VERSION, Event, Finish, FinishReason, Prefill, Start, Step, decode_rate
from loopchat.version import __version__


class TraceError(Exception):
    """A trace file that cannot be read; the message says which line and why."""


class TraceWriter:
    def __init__(self, path: str | Path, *, extra: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        try:
            self._file: IO[str] = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            raise TraceError(f"cannot write the trace file {self.path}: {exc.strerror}") from None
        self._t0 = time.perf_counter()
        header = {
            "kind": "header",
            "schema_version": SCHEMA_VERSION,
            "loopchat_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if extra:
            header.update(extra)
        self._write(header)

    def _write(self, obj: dict[str, Any]) -> None:
        try:
            self._file.write(json.dumps(obj, ensure_ascii=False) + "\n")
        except OSError as exc:  # a full disk (ENOSPC), a file size limit (EFBIG), ...
            raise self._error(exc) from None

    def _error(self, exc: OSError) -> TraceError:
        return TraceError(f"cannot write the trace file {self.path} ({exc.strerror or exc})")

    def write(self, event: Event) -> None:
        """Append one event; TraceError if the file cannot be written."""
        obj = to_json_dict(event)
        obj["t_ms"] = round((time.perf_counter() - self._t0) * 1000.0, 3)
        self._write(obj)

    def close(self) -> None:
        """Flush and close; TraceError if what was buffered cannot be written."""
        try:
            self._file.close()
        except OSError as exc:
            raise self._error(exc) from None

    def abandon(self) -> None:
        """Close after a failed write, ignoring further errors (what got written stays:
        read_trace reads it as a trace cut short)."""
        try:
            self._file.close()
        except OSError:
            pass

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class TracedEvent:
    t_ms: float
    event: Event
    #: True for a Finish that read_trace made up because the trace ends (or the next reply
    #: starts) before the reply's own finish event: see `cut_short_finish`.
    synthetic: bool = False


#: Finish.error of the Finish that read_trace adds to a reply whose trace was cut short.
CUT_SHORT = "the trace ends before this reply's finish event (cut short?)"


def read_trace(path: str | Path) -> tuple[dict[str, Any], list[TracedEvent]]:
    """The header and the events of a trace file.

    Every reply in the result ends with a Finish: a reply whose finish event is missing
    (the writer was killed or the disk filled up; the file ends at a line boundary, or in
    the middle of its last line, which is then dropped) gets one made up from its events,
    with reason "error" and error CUT_SHORT, marked `synthetic`; the header then has
    "cut_short": true. Anything else that is not a loopchat trace is a TraceError naming
    the file and line.
    """
    path = Path(path)
    try:
        data = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read the trace file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path} is not a loopchat trace (not UTF-8 text)") from None
    lines = data.splitlines()
    if not lines:
        raise TraceError(f"{path} is empty: record one with `loopchat run --trace {path} ...`")
    last_line_cut = not data.endswith("\n")
    header: dict[str, Any] = {}
    events: list[TracedEvent] = []
    # the events of each reply whose Finish has not come yet, by sequence (batch.py: N replies
    # written in one batch interleave; None: a reply alone)
    open_runs: dict[int | None, list[TracedEvent]] = {}
    cut_short = False
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if n == len(lines) and last_line_cut and n > 1:
                cut_short = True  # the writer stopped in the middle of this line
                break
            raise TraceError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise TraceError(
                f"{path}:{n}: not a loopchat trace (each line must be a JSON object, this one is {_json_kind(obj)})"
            )
        if n == 1:
            if obj.get("kind") != "header":
                raise TraceError(f"{path}:1: not a loopchat trace (no header line)")
            version = obj.get("schema_version")
            if version != SCHEMA_VERSION:
                raise TraceError(
                    f"{path}: trace schema version {version} is not supported (this loopchat reads {SCHEMA_VERSION})"
                )
            header = obj
            continue
        try:
            traced = TracedEvent(float(obj.get("t_ms", 0.0)), event_from_json_dict(obj))
        except Exception as exc:  # noqa: BLE001 - any malformed field: TypeError, ValueError, SettingsError...
            raise TraceError(f"{path}:{n}: bad event ({one_line(str(exc)) or type(exc).__name__})") from None
        seq = getattr(traced.event, "sequence", None)
        if isinstance(traced.event, Start):
            if seq is None or seq == 0:  # a new reply (or batch): one still open never finished
                for run in open_runs.values():
                    events.append(cut_short_finish(run))
                    cut_short = True
                open_runs = {}
            open_runs[seq] = [traced]
        elif isinstance(traced.event, Finish):
            open_runs.pop(seq, None)
        else:  # (a batch's shared events, its Prefill: every reply's)
            for key, run in open_runs.items():
                if seq is None or key == seq:
                    run.append(traced)
        events.append(traced)
    for run in open_runs.values():
        events.append(cut_short_finish(run))
        cut_short = True
    if cut_short:
        header = {**header, "cut_short": True}
    return header, events


def cut_short_finish(run: list[TracedEvent]) -> TracedEvent:
    """A Finish for a reply whose trace stops after `run` (its Start and what followed),
    every number computed from those events as the engine would have."""
    finish = cut_short_event(run)
    sequence = getattr(run[0].event, "sequence", None)
    if sequence is not None:  # one of a batch's replies (batch.py)
        finish = dataclasses.replace(finish, sequence=sequence)
    return TracedEvent(run[-1].t_ms, finish, synthetic=True)


def cut_short_event(run: list[TracedEvent]) -> Finish:
    """The Finish event of `cut_short_finish`."""
    start = run[0].event
    assert isinstance(start, Start)
    prefill = next((t.event for t in run if isinstance(t.event, Prefill)), None)
    # a branch's first steps are the reply it continues: the run's own follow them
    steps = [t.event for t in run if isinstance(t.event, Step) and t.event.index >= len(start.reply_prefix)]
    first_ms = steps[0].elapsed_ms if steps else 0.0
    last_ms = steps[-1].elapsed_ms if steps else 0.0
    decode_ms = last_ms - first_ms
    ids = start.prompt_token_ids  # None: a remote server's reply (not given)
    return Finish(
        reason=FinishReason.ERROR,
        prompt_tokens=len(ids) if ids is not None else None,
        completion_tokens=sum(1 for s in steps if not s.is_stop),
        steps=len(steps),
        prefill_ms=prefill.ms if prefill is not None else (None if start.source else 0.0),
        ttft_ms=first_ms,
        decode_ms=decode_ms,
        total_ms=last_ms,
        tokens_per_s=decode_rate(len(steps), decode_ms),
        text="".join(s.text for s in steps),
        # what the engine reports when it stops after a step: that step's token is not yet in the cache
        n_past=(
            (steps[-1].n_past - (0 if steps[-1].is_stop else 1) if steps[-1].n_past is not None else None)
            if steps
            else (len(ids) if ids is not None else None)
        ),
        n_ctx=start.n_ctx,
        error=CUT_SHORT,
    )


def _json_kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
