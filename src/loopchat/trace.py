"""Trace files: one JSON object per line, one line per event (docs/trace-format.md).

The first line is a header with the schema version; every event line carries `t_ms`,
the milliseconds since the trace was opened, so a replay can keep the recorded pace.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from . import __version__
from .events import SCHEMA_VERSION, Event, event_from_json_dict, to_json_dict


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
        self._file.write(json.dumps(obj, ensure_ascii=False) + "\n")

    def write(self, event: Event) -> None:
        obj = to_json_dict(event)
        obj["t_ms"] = round((time.perf_counter() - self._t0) * 1000.0, 3)
        self._write(obj)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class TracedEvent:
    t_ms: float
    event: Event


def read_trace(path: str | Path) -> tuple[dict[str, Any], list[TracedEvent]]:
    """The header and the events of a trace file."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TraceError(f"cannot read the trace file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path} is not a loopchat trace (not UTF-8 text)") from None
    if not lines:
        raise TraceError(f"{path} is empty: record one with `loopchat run --trace {path} ...`")
    header: dict[str, Any] = {}
    events: list[TracedEvent] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}:{n}: not JSON ({exc.msg})") from None
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
            events.append(TracedEvent(float(obj.get("t_ms", 0.0)), event_from_json_dict(obj)))
        except (TypeError, ValueError, KeyError) as exc:
            raise TraceError(f"{path}:{n}: bad event ({exc})") from None
    return header, events
