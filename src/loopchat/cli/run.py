"""`loopchat run`: one reply, headless, from the same events the TUI shows.

The flags become one ReplyRequest, asked of a Backend like the chat's: a LiveBackend
(the engine on its own worker thread, which loads the model and runs every call on it),
or with `--url` (or a models.toml entry with `url`) a RemoteBackend, which asks an
OpenAI-compatible server and hands over the same events; what that server does not send
is printed as "not given". The main thread prints what arrives (run_reply.py), so Ctrl+C
is handled at once and cancels the run, during a long prefill too.
"""

from __future__ import annotations

import argparse
import os
import queue
import stat
import sys
from pathlib import Path
from typing import Any, TextIO

from loopchat.cli.run_stages import cli_pairs
from loopchat.config import API_KEY_ENV
from loopchat.constraint import Constraint, ConstraintError, read_constraint
from loopchat.errors import UsageError
from loopchat.events import DOCUMENT, Message
from loopchat.request import ReplyRequest
from loopchat.settings import SETTINGS, SamplingSettings
from loopchat.stop_strings import MAX_STOP_STRINGS
from loopchat.watch import WatchError, check_watch


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
    changes = {
        s.name: getattr(args, s.name)
        for s in SETTINGS
        if getattr(args, s.name, None) is not None and s.type is not tuple  # (the bias: run_stages.with_bias)
    }
    return base.replace(**changes)


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
    if spec is not None and not spec.remote:  # spec is None: --url names the server
        for flag, name in (("--model-id", "model_id"), ("--api-key", "api_key"), ("--timeout", "timeout")):
            if getattr(args, name, None) is not None:
                raise UsageError(f"{flag} is for a model on a server: give --url too (or a models.toml model with url)")
        return None
    if getattr(args, "threads", None) is not None:
        raise UsageError("--threads has no meaning for a model on a server: the server chooses its threads")
    if getattr(args, "flash_attn", None) is not None:
        raise UsageError("--flash-attn has no meaning for a model on a server: the server chooses it")
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
            )
        except URLProblem as exc:
            raise UsageError(f"--url: {exc}") from None
    from loopchat.backends.models_backend import remote_backend

    return remote_backend(spec, model_id=getattr(args, "model_id", None), api_key=key, timeout=timeout)


def run_command(args: argparse.Namespace, stdin: TextIO | None = None, out: TextIO | None = None) -> int:
    """Generate one reply; return the exit code. Every failure ends with exactly one line
    `loopchat: ...` on stderr saying what to do: 2 for bad input (the prompt, the model
    file, a prompt longer than the context), 1 when the run itself failed (an error in
    llama.cpp or in loopchat, stdout or the trace file could not be written), 130 for
    Ctrl+C."""
    from loopchat.cli.run_reply import Output, ReplyReader, errors_setting
    from loopchat.trace import TraceWriter

    out = out or sys.stdout
    remote, spec, model_path, request = prepare(args, stdin if stdin is not None else sys.stdin)
    trace = TraceWriter(args.trace) if args.trace else None
    errors_setting(out)
    output = Output(out)
    events: queue.Queue[Any] = queue.Queue()
    if remote is not None:  # a server: the same events, from the wire; its model list first (ModelReady)
        backend = remote
        backend.attach(events.put)
        backend.start()
    else:  # the engine on a worker thread, loading the model resolved above
        backend = _local_backend(args)
        backend.attach(events.put)
        backend.load_file(spec, model_path)
    if request.n > 1:  # N replies in one batch (run_batch.py)
        from loopchat.cli.run_batch import BatchReader

        reader: ReplyReader = BatchReader(args, backend, request, output, trace)
    else:
        reader = ReplyReader(args, backend, request, output, trace)
    reader.read(events)
    return reader.report()


def prepare(args: argparse.Namespace, stdin: TextIO | None) -> tuple[Any, Any, Path | None, ReplyRequest]:
    """The reply the flags ask for, checked: (the server's backend, or None for a model
    run here; that model's spec; its file, resolved (it may be downloaded); the request).
    UsageError for what does not fit, in the order a user should deal with it."""
    from loopchat.config import load_config

    prompt = read_prompt(args.prompt, stdin)
    if getattr(args, "show_stages", False):
        args.show_steps = True  # (the steps' lines, the waterfall under each)
    if args.system is not None:
        check_utf8(args.system, "the --system text")
    config = load_config(getattr(args, "config", None))
    if args.top_report < 1 or args.top_report > 100:
        raise UsageError("--top-report must be between 1 and 100")
    stop = tuple(dict.fromkeys(getattr(args, "stop", None) or ()))
    if len(stop) > MAX_STOP_STRINGS or "" in stop:
        raise UsageError(f"--stop takes a text that is not empty, up to {MAX_STOP_STRINGS} times")
    remote = remote_for(args, config)
    if cli_pairs(getattr(args, "logit_bias", None)) and remote is not None:
        raise UsageError("--logit-bias TEXT=BIAS needs the model's tokenizer: use it with a model run here, not --url")
    spec = None if getattr(args, "url", None) else config.get(getattr(args, "model", None))
    if remote is not None:
        settings, model_path = settings_from_args(remote.default_settings, args), None
    else:
        assert spec is not None  # (no --url: a model of models.toml)
        settings = settings_from_args(spec.sampling, args)
        model_path = spec.resolve_file()
    messages = _messages(args, prompt, spec, remote)
    score_only = getattr(args, "score_only", False)  # (it implies --prompt-logprobs)
    scored, lens = getattr(args, "prompt_logprobs", False) or score_only, getattr(args, "lens", False)
    try:
        watch = check_watch(tuple(getattr(args, "watch", None) or ()))
    except WatchError as exc:
        raise UsageError(f"--watch: {exc}") from None
    n, prediction = getattr(args, "n", 1), read_prediction(getattr(args, "prediction", None))
    if score_only and n > 1:
        raise UsageError(f"--score-only writes no reply, and -n {n} asks for {n}: leave out one of them")
    drafted = getattr(args, "draft", None) not in (None, "off") or bool(prediction)  # (a batch drafts nothing)
    if n > 1 and (remote is not None or lens or getattr(args, "blocking", False) or drafted):
        asked = (
            "--url (a server's replies: one at a time here)"
            if remote is not None
            else "--lens"
            if lens
            else "--blocking"
            if getattr(args, "blocking", False)
            else "--prediction (a batch's passes draft nothing)"
            if prediction
            else f"--draft {args.draft} (a batch's passes draft nothing)"
        )
        raise UsageError(f"-n {n} writes its replies in one batch on a model run here: leave out {asked}, or -n")
    if (scored or lens or watch) and remote is not None:
        asked = "--score-only" if score_only else "--prompt-logprobs" if scored else "--lens" if lens else "--watch"
        raise UsageError(
            f"{asked} needs a model run here, not one on a server "
            "(a server's prompt logprobs: its completions with echo and logprobs)"
        )
    request = ReplyRequest(
        messages,
        settings,
        stop=stop,
        report_k=args.top_report,
        stream=not args.blocking,
        prompt_logprobs=1 if scored else None,
        score_only=score_only,
        lens=bool(lens),
        watch=watch,
        constraint=constraint_from_args(args, spec),
        n=n,
        prediction=prediction,
    )
    return remote, spec, model_path, request


def read_prediction(path: str | None) -> str:
    """--prediction's text ("": none); UsageError in one line for a file it cannot read."""
    if path is None:
        return ""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--prediction {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UsageError(f"--prediction {path} is not UTF-8 text: give a text file") from None
    if not text:
        raise UsageError(f"--prediction {path} is empty: give the text the reply is expected to be much like")
    return text


def constraint_from_args(args: argparse.Namespace, spec: Any) -> Constraint | None:
    """--grammar, --json-schema or --json, else the model's from models.toml; checked before
    any reply (UsageError: one line naming the file and the position)."""
    from loopchat.engine.constraint_grammar import check

    try:
        if getattr(args, "grammar", None):
            constraint: Constraint | None = read_constraint("grammar", args.grammar)
        elif getattr(args, "json_schema", None):
            constraint = read_constraint("json_schema", args.json_schema)
        elif getattr(args, "json", False):
            constraint = Constraint.any_json("--json")
        else:
            constraint = spec.constraint() if spec is not None else None
        if constraint is not None:
            check(constraint)
    except ConstraintError as exc:
        raise UsageError(str(exc)) from None
    return constraint


def _messages(args: argparse.Namespace, prompt: str, spec: Any, remote: Any) -> tuple[Message, ...]:
    """The prompt as a document (--raw, a completion-mode model) or as a chat turn, after
    the system prompt (--system, else the model's)."""
    if getattr(args, "raw", False) or (spec is not None and spec.mode == "completion"):
        if args.system is not None:
            why = (
                "a --raw document"
                if getattr(args, "raw", False)
                else f'model {spec.name!r}\'s documents (mode = "completion" in models.toml)'
            )
            raise UsageError(f"--system has no place in {why}: write it into the document")
        return (Message(DOCUMENT, prompt),)
    default_system = remote.system_prompt if remote is not None else spec.system_prompt
    system = args.system if args.system is not None else default_system
    return ((Message("system", system),) if system else ()) + (Message("user", prompt),)


def _local_backend(args: argparse.Namespace) -> Any:
    """The model run here: a LiveBackend with the engine on a worker thread."""
    from loopchat.backends.live import LiveBackend
    from loopchat.threads_setting import threads_or_env

    # the model's spec comes with load_file (models.toml was read once, by prepare)
    return LiveBackend(
        None,
        None,
        verbose=bool(getattr(args, "verbose", False)),
        threads=threads_or_env(getattr(args, "threads", None)),
        host="thread",
        flash_attn=getattr(args, "flash_attn", None),
        draft_model=getattr(args, "draft_model", None),
    )
