"""`loopchat run -n N`: N replies to the prompt in one batch (batch.py), read from the backend's
events like one reply's (run_reply.py), printed when the batch ends: each reply under its label,
then the batch's figures on stderr (tokens a second together, a batched pass against one
sequence's). `--show-steps` prints each step's line as it comes, labelled with its reply."""

from __future__ import annotations

import sys
from typing import Any

from loopchat.batch import batch_figures, figures_line
from loopchat.cli.run_reply import ReplyReader, _fail, constraint_lines
from loopchat.events import Finish, Step


class BatchReader(ReplyReader):
    """The N replies of one batch: their Finishes kept by sequence, their steps for the figures."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.finishes: dict[int, Finish] = {}
        self.steps: list[Step] = []

    def _on(self, event: Any) -> bool:
        done = super()._on(event)
        if isinstance(event, Finish) and event.sequence is not None:
            self.finishes[event.sequence] = event
        return done

    def _step(self, event: Step) -> None:
        self.steps.append(event)
        if not self.args.show_steps:
            return
        tag = f"[{(event.sequence or 0) + 1}] "  # (each line of the step's: its stages, its tokens on watch)
        if not self.output.write("".join(f"{tag}{line}\n" for line in self._shown_lines(event))):
            self.backend.cancel()

    def report(self) -> int:
        """Each reply under its label on stdout, the figures on stderr, and the exit code (as one reply's)."""
        n = self.request.n
        for j in sorted(self.finishes):
            f = self.finishes[j]
            label = f"── reply {j + 1} of {n} · {f.completion_tokens} tok · finish: {f.reason.value} ──"
            self.output.write(f"{label}\n{f.text}{'' if f.text.endswith(chr(10)) else chr(10)}")
        self._constraint_lines_by_reply(n)
        if self.steps:
            print(f"loopchat: {figures_line(batch_figures(self.steps))}", file=sys.stderr)
        if self.error is not None:
            return _fail(self.error.message, 1 if self.error.internal else 2)
        if self.interrupted:
            return _fail("interrupted (Ctrl+C): the replies above are partial", 130)
        failed = next((f.error for f in self.finishes.values() if f.error), None)
        if failed:
            return _fail(failed, 1)
        problem = self.output.message()
        if problem is not None:
            return _fail(problem, 1)
        if self.trace_error is not None:
            return _fail(f"{self.trace_error}: the trace is incomplete; free some space or write it elsewhere", 1)
        if len(self.finishes) < n:  # pragma: no cover - the engine ends every sequence with a Finish
            return _fail("the engine ended the batch without every reply; this is a bug: please report it", 1)
        return 0

    def _constraint_lines_by_reply(self, n: int) -> None:
        """Under a constraint, each reply's figures and cut note, as one reply's (run_reply.constraint_lines)."""
        for j in sorted(self.finishes):
            reports = [s.constraint for s in self.steps if (s.sequence or 0) == j and s.constraint is not None]
            constraint_lines(self.request.constraint, self.finishes[j], reports, f"reply {j + 1} of {n}: ")
