"""`loopchat run`'s one reply, read from its backend's events (run.py prepares the
request and the backend): the text printed as it comes (or one line per step), every
event written to the trace, Ctrl+C turned into a cancel, and at the end the summary
line on stderr and the exit code."""

from __future__ import annotations

import argparse
import os
import queue
import sys
from typing import Any, TextIO

from loopchat.cli.run_stages import stage_lines, with_bias
from loopchat.constraint import Constraint, ConstraintReport, cut_note, reply_summary
from loopchat.event_lines import step_line, summary_line, threads_text
from loopchat.events import ContextTrimmed, Finish, ModelReady, Prefill, RunDone, Start, Step, WorkerError
from loopchat.lens_lines import lens_lines
from loopchat.pass_lines import draft_summary, pass_figures, pass_line
from loopchat.prompt_read import prompt_lines
from loopchat.request import ReplyRequest
from loopchat.trace import TraceError, TraceWriter
from loopchat.watch import watched_line

_ENGINE_EVENTS = (Start, ContextTrimmed, Prefill, Step, Finish)


class Output:
    """stdout for the reply: the first failed write (a full disk, /dev/full, a closed
    pipe) is remembered, and nothing more is written after it."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.error: OSError | None = None
        self.line_open = False  # the last text written did not end with a newline
        self.wrote = False  # some text was written

    def write(self, text: str) -> bool:
        if self.error is not None:
            return False
        try:
            if text:  # (set first: a Ctrl+C can land once the text is out, before the next line)
                self.line_open, self.wrote = not text.endswith("\n"), True
            self.out.write(text)
            self.out.flush()
        except OSError as exc:
            self.error = exc
            self._discard()
            return False
        return True

    def _discard(self) -> None:
        """Point the stream's file descriptor at /dev/null: what is still in its buffer
        is then flushed there at exit instead of raising again ("Exception ignored...")."""
        try:
            fd = self.out.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
        except (AttributeError, OSError, ValueError):
            return
        try:
            os.dup2(devnull, fd)
        except OSError:
            pass
        finally:
            os.close(devnull)

    def message(self) -> str | None:
        """The one line to report (None if every write succeeded or the reader left)."""
        if self.error is None or isinstance(self.error, BrokenPipeError):
            return None  # `loopchat run ... | head`: the reader has what it wanted
        reason = self.error.strerror or str(self.error)
        return f"cannot write the reply to standard output ({reason}); free some space or redirect it elsewhere"


def errors_setting(out: TextIO) -> None:
    """An encoding that cannot spell a character of the reply (PYTHONIOENCODING=ascii, a
    latin-1 locale) prints ? for it rather than ending the run with a traceback."""
    reconfigure = getattr(out, "reconfigure", None)
    if reconfigure is not None and getattr(out, "errors", "strict") == "strict":
        try:
            reconfigure(errors="replace")
        except (OSError, ValueError):  # pragma: no cover - a stream that cannot change
            pass


class ReplyReader:
    """One reply of `backend` (a Backend), from the model's ModelReady to the run's end."""

    def __init__(
        self, args: argparse.Namespace, backend: Any, request: ReplyRequest, output: Output, trace: TraceWriter | None
    ) -> None:
        self.args, self.backend, self.request, self.output = args, backend, request, output
        self.trace = trace
        self.trace_error: str | None = None
        self.start: Start | None = None
        self.prefill: Prefill | None = None
        self.finish: Finish | None = None
        self.error: WorkerError | None = None
        self.interrupted = False
        self.generating = False
        self.threads_auto = False
        self.server = ""
        self.client_times = False  # a server that sends no per-step timings: the times are ours, on arrival
        self.threads_used: list[int] = []
        self.constraint_reports: list[ConstraintReport] = []
        self.steps: list[Step] = []  # (their pass fields: the draft's summary)

    def read(self, events: queue.Queue[Any]) -> None:
        """Handle the backend's events until the run ends (its RunDone, or an error);
        Ctrl+C cancels it and waits for its end. The backend is closed after."""
        try:
            while not self._on(_next(events)):
                pass
        except KeyboardInterrupt:
            self.interrupted = True
            self.backend.cancel()
            self._drain(events)
        finally:
            self.backend.close()
            if self.trace is not None:
                try:
                    self.trace.close()
                except TraceError as exc:
                    self.trace_error = str(exc)

    def _on(self, event: Any) -> bool:
        """Handle one event; True when the run is over."""
        if isinstance(event, ModelReady):
            if event.template_note and not self.request.is_document:
                print(f"loopchat: note: {event.template_note}", file=sys.stderr)
            self.request = with_bias(self.request, getattr(self.args, "logit_bias", None), self.backend)
            self.backend.generate(self.request)
            self.generating = True
        elif isinstance(event, WorkerError):
            # the worker emits a run's error before its RunDone, and a load error ends it
            self.error = event
            return True
        elif isinstance(event, RunDone):
            return True
        elif isinstance(event, _ENGINE_EVENTS):
            self.record(event)
            if isinstance(event, Prefill):
                self.prefill = event
                if self.start is not None and event.prompt_logprobs is not None:
                    print("\n".join(prompt_lines(self.start, event)), file=sys.stderr)
            elif isinstance(event, Start):
                self.start = event
                if event.lens_note:
                    print(f"loopchat: note: {event.lens_note}", file=sys.stderr)
                self.threads_auto = event.threads_auto
                self.server = event.source
            elif isinstance(event, Step):
                self._step(event)
            elif isinstance(event, Finish):
                self.finish = event
        return False

    def _step(self, event: Step) -> None:
        previous = self.steps[-1].pass_report if self.steps else None
        self.steps.append(event)
        if getattr(self.args, "show_passes", False) and event.pass_report not in (None, previous):
            print(f"loopchat: {pass_line(event.pass_report)}", file=sys.stderr)
        if event.lens:
            print("\n".join(lens_lines(event)), file=sys.stderr)
        self.client_times = self.client_times or event.forward_ms is None
        if event.threads:
            self.threads_used.append(event.threads)
        if event.constraint is not None:
            self.constraint_reports.append(event.constraint)
        if self.args.show_steps:
            ok = self.output.write("\n".join(self._shown_lines(event)) + "\n")
        elif event.text and not self.args.blocking:  # blocking: the whole text at the end
            ok = self.output.write(event.text)
        else:
            ok = True
        if not ok:
            self.backend.cancel()  # nobody can read the rest: stop generating it

    def _shown_lines(self, event: Step) -> list[str]:
        """--show-steps' lines for a step: its line, its stages (--show-stages), its tokens on watch."""
        lines = [step_line(event), *(stage_lines(event) if getattr(self.args, "show_stages", False) else [])]
        if event.watched and self.start is not None and self.start.watch:
            lines.append(watched_line(event.watched, self.start.watch))
        return lines

    def _drain(self, events: queue.Queue[Any]) -> None:
        """After Ctrl+C: read until the run reports its end (cancel stops it within one
        step); while the model is still loading there is no run to wait for."""
        while self.generating:
            try:
                event = events.get(timeout=5)
            except queue.Empty:
                break
            if isinstance(event, _ENGINE_EVENTS):
                self.record(event)
            if isinstance(event, Finish):
                self.finish = event
            if isinstance(event, (RunDone, WorkerError)):
                break

    def record(self, event: Any) -> None:
        """Write an engine event to the trace; a failed write stops the trace, not the run."""
        if self.trace is None:
            return
        try:
            self.trace.write(event)
        except TraceError as exc:
            self.trace_error = str(exc)
            self.trace.abandon()
            self.trace = None

    def report(self) -> int:
        """The reply's end on stdout, the summary line on stderr, and the exit code: one
        line `loopchat: ...` for the first of what went wrong, in the order a user
        should deal with it."""
        finish, output = self.finish, self.output
        shown = output.wrote  # reply text printed (a token drawn but not printed at Ctrl+C is not)
        if finish is not None:
            text = finish.text if (self.args.show_steps or self.args.blocking) else ""
            shown = shown or bool(text)
            output.write(text + ("" if finish.text.endswith("\n") else "\n"))
            threads = threads_text(self.threads_auto, self.threads_used)
            print(summary_line(self.prefill, finish, threads, self.server, self.client_times), file=sys.stderr)
            if any(s.pass_report is not None for s in self.steps) or self.request.settings.draft != "off":
                print(f"loopchat: draft {draft_summary(pass_figures(self.steps))}", file=sys.stderr)
            self._constraint_lines(finish)
        elif output.line_open:  # a partial reply, ended by an error: end its line
            output.write("\n")
        if self.error is not None:
            return _fail(self.error.message, 1 if self.error.internal else 2)
        if self.interrupted:
            printed = shown and finish is not None and finish.completion_tokens
            said = (
                "the reply above is partial"
                if printed
                else "stopped before the first token"
                if self.generating
                else "stopped while the model was loading"
            )
            return _fail(f"interrupted (Ctrl+C): {said}", 130)
        if finish is not None and finish.error:
            return _fail(finish.error, 1)
        problem = output.message()
        if problem is not None:
            return _fail(problem, 1)
        if self.trace_error is not None:
            return _fail(f"{self.trace_error}: the trace is incomplete; free some space or write it elsewhere", 1)
        if finish is None:  # pragma: no cover - the worker always ends a run with an error or a Finish
            return _fail("the engine ended the run without a reply; this is a bug: please report it", 1)
        return 0

    def _constraint_lines(self, finish: Finish) -> None:
        constraint_lines(self.request.constraint, finish, self.constraint_reports)


def constraint_lines(spec: Constraint | None, finish: Finish, reports: list[ConstraintReport], who: str = "") -> None:
    """A reply under a constraint: its figures, and a line if it was cut before its structure closed,
    on stderr (`who`: "reply 2 of 4: " for a batch's reply)."""
    if spec is None:
        return
    if reports:
        print(f"loopchat: {who}constraint {reply_summary(spec.label(), reports)}", file=sys.stderr)
    if finish.constraint_closed is False or (finish.constraint_closed is None and finish.reason == "length"):
        print(f"loopchat: note: {who}{cut_note(spec.label())}", file=sys.stderr)


def _next(events: queue.Queue[Any]) -> Any:
    """The next event (woken every 0.25 s, so that Ctrl+C is handled at once)."""
    while True:
        try:
            return events.get(timeout=0.25)
        except queue.Empty:
            continue


def _fail(message: str, code: int) -> int:
    print(f"loopchat: {message}", file=sys.stderr)
    return code
