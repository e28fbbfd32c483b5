"""What the engine's hosts are asked to do: one small frozen object per command.

`EngineWorker` (worker.py) takes `Load`, `Generate` and `Close` from its queue;
`ProcessEngineWorker` (process_worker.py) sends those, plus `ChangeSettings` and
`Cancel`, through the pipe to its child. Each host dispatches on the command's type
(`match`), so a command's arguments are named where it is made and read, and a new
per-reply option travels inside the `ReplyRequest` (request.py) without any host
spelling it out.

What crosses to a child process is pickled: `Load.factory` must then be EngineOptions,
and `Generate.live` / `Generate.control` stay None (they are live objects shared with
the asker in this process; the child keeps its own settings source, fed by
`ChangeSettings`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loopchat.events import _pickled_by_init
from loopchat.request import ReplyRequest
from loopchat.settings import LiveSettings, SamplingSettings
from loopchat.step_control import StepControl


@_pickled_by_init
@dataclass(frozen=True, slots=True)
class Load:
    """Close the engine loaded now (if any) and create another with `factory()`."""

    factory: Callable[[], Any]  # an EngineOptions (picklable), or any callable in a thread host
    name: str
    path: str


@_pickled_by_init  # (pickled once per reply, as cheaply as the events)
@dataclass(frozen=True, slots=True)
class Generate:
    """Run one reply; its events end with RunDone(run_id)."""

    run_id: int
    request: ReplyRequest
    #: the settings source read at every pass (None: request.settings throughout)
    live: LiveSettings | None = None
    #: step mode (None: the loop runs freely)
    control: StepControl | None = None


@_pickled_by_init
@dataclass(frozen=True, slots=True)
class ChangeSettings:
    """The reply in flight reads these settings from its next pass (a child process's)."""

    settings: SamplingSettings


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop the reply in flight within one pass."""


@dataclass(frozen=True, slots=True)
class Call:
    """Run `fn(engine)` on the host's thread (a thread host only: a shared run's `serve`, shared_run.py)."""

    fn: Callable[[Any], None]


@dataclass(frozen=True, slots=True)
class Close:
    """Close the engine and end the host."""


#: what an EngineWorker's queue carries
WorkerCommand = Load | Generate | Call | Close
#: what a ProcessEngineWorker's pipe carries to its child
ChildCommand = Load | Generate | ChangeSettings | Cancel | Close

__all__ = ["Call", "Cancel", "ChangeSettings", "ChildCommand", "Close", "Generate", "Load", "WorkerCommand"]
