"""`loopchat run`: one reply, headless, from the same events the TUI shows.

The engine runs on its own worker thread (which loads the model and runs every call on
it); the main thread prints what arrives, so Ctrl+C is handled at once and cancels the
run, during a long prefill too. With `--url` (or a models.toml entry with `url`) a
RemoteBackend asks an OpenAI-compatible server instead and hands over the same events;
what that server does not send is printed as "not given".
"""

from __future__ import annotations

import argparse
import os
import queue
import stat
import sys
from typing import Any, TextIO

from loopchat.config import API_KEY_ENV
from loopchat.errors import UsageError
from loopchat.event_lines import step_line, summary_line, threads_text
from loopchat.events import (
    DOCUMENT,
    ContextTrimmed,
    Finish,
    Message,
    ModelReady,
    Prefill,
    RunDone,
    Start,
    Step,
    WorkerError,
)
from loopchat.settings import SETTINGS, LiveSettings, SamplingSettings
from loopchat.stop_strings import MAX_STOP_STRINGS

_ENGINE_EVENTS = (Start, ContextTrimmed, Prefill, Step, Finish)


def read_prompt(prompt: str, stdin: TextIO | None) -> str:
    if prompt == "-":
        if stdin is None or stdin.closed:
            raise UsageError("the prompt is - but there is no standard input; pipe the prompt in or pass it as text")
        prompt = _read_stdin_text(stdin)
    else:
        if stdin is not None and not stdin.closed and stdin_has_data(stdin):
            raise UsageError(
                "the prompt was given as text and standard input has data too: pass - to read the prompt "
                "from standard input, or run with </dev/null to ignore it"
            )
        check_utf8(prompt, "the prompt")
    if not prompt.strip():
        raise UsageError("the prompt is empty: pass the message as text, or - to read it from stdin")
    return prompt


def stdin_has_data(stdin: TextIO) -> bool:
    """Whether standard input holds data a user meant as the prompt: a regular file with
    bytes left to read, or a pipe/FIFO/socket with bytes waiting in it now.

    A terminal, /dev/null, a closed stdin and an empty pipe (a CI runner's or a test
    harness's stdin, whose writer may never close it) do not count: only data that has
    already arrived does. (A writer slower than our start-up is not caught; that errs on
    the side of running.)"""
    try:
        fd = stdin.fileno()
        st = os.fstat(fd)
    except (AttributeError, OSError, ValueError):  # no real file behind it (tests pass a StringIO)
        return False
    if stat.S_ISREG(st.st_mode):
        try:
            position = os.lseek(fd, 0, os.SEEK_CUR)
        except OSError:
            position = 0
        return st.st_size > position
    if stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
        try:
            import array
            import fcntl
            import termios

            waiting = array.array("i", [0])
            fcntl.ioctl(fd, termios.FIONREAD, waiting, True)
        except (ImportError, OSError):  # pragma: no cover - not POSIX
            return False
        return waiting[0] > 0
    return False


def _read_stdin_text(stdin: TextIO) -> str:
    """All of stdin as text, decoded as UTF-8 whatever the locale or PYTHONIOENCODING say
    (the model reads UTF-8; a latin-1 terminal would otherwise pass mojibake on, and a C
    locale would let undecodable bytes through as surrogates)."""
    buffer = getattr(stdin, "buffer", None)
    if buffer is None:  # a text stream with no bytes underneath (tests)
        text = stdin.read()
        check_utf8(text, "the prompt on standard input")
        return text
    raw = buffer.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"the prompt on standard input is not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte offset "
            f"{exc.start}); convert it first, e.g. with `iconv -f latin1 -t utf-8`"
        ) from None


def check_utf8(text: str, what: str) -> None:
    """UsageError if `text` holds bytes that were not UTF-8 (Python passes them on from the
    command line as lone surrogates, which the model's tokenizer cannot encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        offset = len(text[: exc.start].encode("utf-8"))
        code = ord(text[exc.start])
        byte = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise UsageError(
            f"{what} is not UTF-8 text ({byte} at byte offset {offset}); convert it to UTF-8 first"
        ) from None


def settings_from_args(base: SamplingSettings, args: argparse.Namespace) -> SamplingSettings:
    """`base` (the model's settings) with the flags given on the command line."""
    changes = {s.name: getattr(args, s.name) for s in SETTINGS if getattr(args, s.name, None) is not None}
    return base.replace(**changes)


class _Output:
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


def _errors_setting(out: TextIO) -> None:
    """An encoding that cannot spell a character of the reply (PYTHONIOENCODING=ascii, a
    latin-1 locale) prints ? for it rather than ending the run with a traceback."""
    reconfigure = getattr(out, "reconfigure", None)
    if reconfigure is not None and getattr(out, "errors", "strict") == "strict":
        try:
            reconfigure(errors="replace")
        except (OSError, ValueError):  # pragma: no cover - a stream that cannot change
            pass


class _LocalRun:
    """The engine on a worker thread, for one reply."""

    def __init__(
        self, worker: Any, messages: list[Message], live: LiveSettings, report_k: int, stop: tuple[str, ...]
    ) -> None:
        self.worker, self.messages, self.live, self.report_k, self.stop = worker, messages, live, report_k, stop

    def generate(self) -> None:
        self.worker.generate(self.messages, self.live, report_k=self.report_k, stop=self.stop)

    def cancel(self) -> None:
        self.worker.cancel()

    def close(self) -> None:
        self.worker.close()


class _RemoteRun:
    """A server, for one reply: its model list is read first (ModelReady), then the reply."""

    def __init__(
        self,
        backend: Any,
        sink: Any,
        messages: list[Message],
        settings: SamplingSettings,
        stream: bool,
        stop: tuple[str, ...],
    ) -> None:
        self.backend, self.messages, self.settings, self.stream, self.stop = backend, messages, settings, stream, stop
        backend.attach(sink)
        backend.start()

    def generate(self) -> None:
        self.backend.generate(self.messages, self.settings, stream=self.stream, stop=self.stop)

    def cancel(self) -> None:
        self.backend.cancel()

    def close(self) -> None:
        self.backend.close()


def remote_for(args: argparse.Namespace, config: Any) -> Any:
    """The RemoteBackend `loopchat run` talks to (`--url`, or a models.toml entry with
    `url`), or None for a model run here. UsageError for options that do not fit."""
    from loopchat.backends.remote import DEFAULT_TIMEOUT, RemoteBackend, URLProblem
    from loopchat.wire import MAX_TOP_LOGPROBS

    url = getattr(args, "url", None)
    model = getattr(args, "model", None)
    if url is not None and model is not None:
        raise UsageError("--model and --url both name a model: with --url, --model-id picks the server's model")
    spec = None if url is not None else config.get(model)
    if url is None and not spec.remote:
        for flag, name in (("--model-id", "model_id"), ("--api-key", "api_key"), ("--timeout", "timeout")):
            if getattr(args, name, None) is not None:
                raise UsageError(f"{flag} is for a model on a server: give --url too (or a models.toml model with url)")
        return None
    if getattr(args, "threads", None) is not None:
        raise UsageError("--threads has no meaning for a model on a server: the server chooses its threads")
    if args.top_report > MAX_TOP_LOGPROBS:
        raise UsageError(f"--top-report can be at most {MAX_TOP_LOGPROBS} for a server (OpenAI's top_logprobs limit)")
    timeout = getattr(args, "timeout", None)
    if timeout is not None and not 0 < timeout <= 86_400:
        raise UsageError("--timeout must be a number of seconds above 0 (and at most 86400)")
    key = getattr(args, "api_key", None)
    if url is not None:
        try:
            return RemoteBackend(
                url,
                model_id=getattr(args, "model_id", None),
                api_key=key or os.environ.get(API_KEY_ENV),
                timeout=timeout or DEFAULT_TIMEOUT,
                top_logprobs=args.top_report,
            )
        except URLProblem as exc:
            raise UsageError(f"--url: {exc}") from None
    from loopchat.backends.models_backend import remote_backend

    return remote_backend(
        spec, top_logprobs=args.top_report, model_id=getattr(args, "model_id", None), api_key=key, timeout=timeout
    )


#: The environment variable `--url` takes the server's API key from when --api-key is not given.


def run_command(args: argparse.Namespace, stdin: TextIO | None = None, out: TextIO | None = None) -> int:
    """Generate one reply; return the exit code. Every failure ends with exactly one line
    `loopchat: ...` on stderr saying what to do: 2 for bad input (the prompt, the model
    file, a prompt longer than the context), 1 when the run itself failed (an error in
    llama.cpp or in loopchat, stdout or the trace file could not be written), 130 for
    Ctrl+C."""
    from loopchat.config import load_config
    from loopchat.engine.options import EngineOptions
    from loopchat.engine.worker import EngineWorker
    from loopchat.trace import TraceError, TraceWriter

    out = out or sys.stdout
    prompt = read_prompt(args.prompt, stdin if stdin is not None else sys.stdin)
    if args.system is not None:
        check_utf8(args.system, "the --system text")
    config = load_config(getattr(args, "config", None))
    if args.top_report < 1 or args.top_report > 100:
        raise UsageError("--top-report must be between 1 and 100")
    stop = tuple(dict.fromkeys(getattr(args, "stop", None) or ()))
    if len(stop) > MAX_STOP_STRINGS or "" in stop:
        raise UsageError(f"--stop takes a text that is not empty, up to {MAX_STOP_STRINGS} times")
    remote = remote_for(args, config)
    spec = None if getattr(args, "url", None) else config.get(getattr(args, "model", None))
    settings = settings_from_args(remote.default_settings if remote is not None else spec.sampling, args)
    model_path = spec.resolve_file() if remote is None else None
    if getattr(args, "raw", False) or (spec is not None and spec.mode == "completion"):
        if args.system is not None:
            why = (
                "a --raw document"
                if getattr(args, "raw", False)
                else f'model {spec.name!r}\'s documents (mode = "completion" in models.toml)'
            )
            raise UsageError(f"--system has no place in {why}: write it into the document")
        messages = [Message(DOCUMENT, prompt)]
    else:
        default_system = remote.system_prompt if remote is not None else spec.system_prompt
        system = args.system if args.system is not None else default_system
        messages = ([Message("system", system)] if system else []) + [Message("user", prompt)]
    trace = TraceWriter(args.trace) if args.trace else None
    trace_error: str | None = None
    _errors_setting(out)
    output = _Output(out)

    events: queue.Queue[Any] = queue.Queue()
    live = LiveSettings(settings)
    if remote is not None:  # a server: the same events, from the wire
        worker: Any = _RemoteRun(remote, events.put, messages, settings, stream=not args.blocking, stop=stop)
    else:
        worker = _LocalRun(EngineWorker(events.put), messages, live, report_k=args.top_report, stop=stop)
        options = EngineOptions.from_spec(
            spec, model_path, verbose=bool(getattr(args, "verbose", False)), threads=getattr(args, "threads", None)
        )
        worker.worker.load(options, spec.name, model_path)
    prefill: Prefill | None = None
    finish: Finish | None = None
    error: WorkerError | None = None
    interrupted = False

    def record(event: Any) -> None:
        """Write an engine event to the trace; a failed write stops the trace, not the run."""
        nonlocal trace, trace_error
        if trace is None:
            return
        try:
            trace.write(event)
        except TraceError as exc:
            trace_error = str(exc)
            trace.abandon()
            trace = None

    generating = False
    threads_auto = False
    server = ""
    client_times = False  # a server that sends no per-step timings: the times are ours, on arrival
    threads_used: list[int] = []
    try:
        while True:
            try:
                event = events.get(timeout=0.25)
            except queue.Empty:
                continue
            if isinstance(event, ModelReady):
                if event.template_note and messages[0].role != DOCUMENT:
                    print(f"loopchat: note: {event.template_note}", file=sys.stderr)
                worker.generate()
                generating = True
            elif isinstance(event, WorkerError):
                # the worker emits a run's error before its RunDone, and a load error ends it
                error = event
                break
            elif isinstance(event, RunDone):
                break
            elif isinstance(event, _ENGINE_EVENTS):
                record(event)
                if isinstance(event, Prefill):
                    prefill = event
                elif isinstance(event, Start):
                    threads_auto = event.threads_auto
                    server = event.source
                elif isinstance(event, Step):
                    client_times = client_times or event.forward_ms is None
                    if event.threads:
                        threads_used.append(event.threads)
                    if args.show_steps:
                        ok = output.write(step_line(event) + "\n")
                    elif event.text and not args.blocking:  # blocking: the whole text at the end
                        ok = output.write(event.text)
                    else:
                        ok = True
                    if not ok:
                        worker.cancel()  # nobody can read the rest: stop generating it
                elif isinstance(event, Finish):
                    finish = event
    except KeyboardInterrupt:
        interrupted = True
        worker.cancel()
        # drain until the run reports its end (cancel stops it within one step); while
        # the model is still loading there is no run to wait for
        while generating:
            try:
                event = events.get(timeout=5)
            except queue.Empty:
                break
            if isinstance(event, _ENGINE_EVENTS):
                record(event)
            if isinstance(event, Finish):
                finish = event
            if isinstance(event, (RunDone, WorkerError)):
                break
    finally:
        worker.close()
        if trace is not None:
            try:
                trace.close()
            except TraceError as exc:
                trace_error = str(exc)

    shown = output.wrote  # reply text printed (a token drawn but not printed at Ctrl+C is not)
    if finish is not None:
        text = finish.text if (args.show_steps or args.blocking) else ""
        shown = shown or bool(text)
        output.write(text + ("" if finish.text.endswith("\n") else "\n"))
        print(
            summary_line(prefill, finish, threads_text(threads_auto, threads_used), server, client_times),
            file=sys.stderr,
        )
    elif output.line_open:  # a partial reply, ended by an error: end its line
        output.write("\n")
    # one line: the first of what went wrong, in the order a user should deal with it
    if error is not None:
        print(f"loopchat: {error.message}", file=sys.stderr)
        return 1 if error.internal else 2
    if interrupted:
        printed = shown and finish is not None and finish.completion_tokens
        said = (
            "the reply above is partial"
            if printed
            else "stopped before the first token"
            if generating
            else "stopped while the model was loading"
        )
        print(f"loopchat: interrupted (Ctrl+C): {said}", file=sys.stderr)
        return 130
    if finish is not None and finish.error:
        print(f"loopchat: {finish.error}", file=sys.stderr)
        return 1
    problem = output.message()
    if problem is not None:
        print(f"loopchat: {problem}", file=sys.stderr)
        return 1
    if trace_error is not None:
        print(
            f"loopchat: {trace_error}: the trace is incomplete; free some space or write it elsewhere", file=sys.stderr
        )
        return 1
    if finish is None:  # pragma: no cover - the worker always ends a run with an error or a Finish
        print("loopchat: the engine ended the run without a reply; this is a bug: please report it", file=sys.stderr)
        return 1
    return 0
