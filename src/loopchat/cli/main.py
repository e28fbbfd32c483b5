"""Command line: `loopchat` (the chat TUI), `loopchat run`, `loopchat serve`, `loopchat web`, `loopchat models`,
`loopchat replay`.

Bad input gives one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, Literal, NoReturn

from loopchat.errors import UsageError
from loopchat.settings import SETTINGS
from loopchat.version import __version__

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # no abbreviations: the chat's `--draft lookup` was taken for `--draft-model lookup`
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # one line instead of usage + error
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _replies(text: str) -> int:
    from loopchat.batch import check_n

    try:
        return check_n(int(text) if text.strip().lstrip("-").isdigit() else text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _threads(text: str) -> int | Literal["auto"]:
    from loopchat.threads_setting import parse_threads

    try:
        return parse_threads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _flash_attn(text: str) -> Literal["auto", "on", "off"]:
    from loopchat.flash_attn_setting import parse_flash_attn

    try:
        return parse_flash_attn(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_model_options(p: argparse.ArgumentParser, *, sub: bool = False) -> None:
    # On a subcommand the defaults are suppressed so `loopchat --model X run ...` keeps X.
    d: dict[str, Any] = {"default": argparse.SUPPRESS} if sub else {}
    p.add_argument("--config", metavar="PATH", help="models.toml to use (default: the user config dir)", **d)
    p.add_argument(
        "--model",
        "-m",
        metavar="NAME|FILE.gguf",
        help="a model from models.toml (default: its `default`), or the path of any GGUF file",
        **d,
    )
    p.add_argument(
        "--threads",
        type=_threads,
        metavar="auto|N",
        help='llama.cpp threads: "auto" measures and picks the fastest count now (the default, '
        "unless models.toml pins one); N pins it (default: $LOOPCHAT_THREADS if set)",
        **d,
    )
    p.add_argument(
        "--flash-attn",
        type=_flash_attn,
        metavar="auto|on|off",
        help='flash attention in llama.cpp: "auto" lets llama.cpp decide (on wherever it can run it: '
        "the default, but for the bundled model, off; unless models.toml sets flash_attn)",
        **d,
    )
    p.add_argument(
        "--draft-model",
        metavar="PATH",
        help="a GGUF with the model's vocabulary that drafts tokens for --draft model (speculative "
        "decoding; default: models.toml's draft)",
        **d,
    )
    p.add_argument("--verbose", action="store_true", help="show llama.cpp's log output on stderr too", **d)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 86_400:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 86400 seconds, got {text}")
    return value


def _add_remote_options(p: argparse.ArgumentParser, *, sub: bool = False) -> None:
    """A model on an OpenAI-compatible server instead of one run here."""
    d: dict[str, Any] = {"default": argparse.SUPPRESS} if sub else {}
    p.add_argument(
        "--url",
        metavar="URL",
        help="talk to an OpenAI-compatible server (llama.cpp's, loopchat serve, ...) at URL "
        "(e.g. http://127.0.0.1:8000/v1; /v1 may be left out)",
        **d,
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        help="the server's API key (default: $LOOPCHAT_API_KEY, which keeps it out of `ps`)",
        **d,
    )
    p.add_argument("--model-id", metavar="ID", help="the server's model (default: the first of its /v1/models)", **d)
    p.add_argument(
        "--timeout",
        type=_seconds,
        metavar="S",
        help="seconds to wait for the server's next bytes (blocking: for the whole reply); default 120",
        **d,
    )


def _add_setting_flags(run: Any) -> None:
    """One flag per sampling setting (settings.SETTINGS); unset: the model's from models.toml."""
    for spec in SETTINGS:
        if spec.type is tuple:  # a setting of its own kind (the logit bias): repeatable, typed as text
            run.add_argument(spec.flag, dest=spec.name, action="append", metavar="TEXT=BIAS", help=spec.hint)
            continue
        if spec.kind is not None:  # one word of a few (the draft)
            run.add_argument(spec.flag, dest=spec.name, choices=spec.kind.choices, help=spec.hint)
            continue
        run.add_argument(
            spec.flag,
            dest=spec.name,
            type=spec.type,
            metavar="N" if spec.type is int else "X",
            help=f"{spec.range_text()}; {spec.hint}",
        )


def _add_run_parser(sub: Any) -> None:
    """`loopchat run`: its prompt, the model or server, the sampling flags and what to print."""
    run = sub.add_parser("run", help="generate one reply headless, streamed to stdout")
    run.add_argument("prompt", help="the user message; - reads it from stdin")
    _add_model_options(run, sub=True)
    _add_remote_options(run, sub=True)
    run.add_argument("--system", metavar="TEXT", help="system prompt (default: the model's from models.toml)")
    run.add_argument(
        "--raw",
        action="store_true",
        help="completion mode: the prompt is a document the model continues as it is, with no chat "
        "template (the natural mode for a base model)",
    )
    _add_setting_flags(run)
    run.add_argument(
        "--top-report", type=int, default=10, metavar="K", help="candidates recorded per step (default 10)"
    )
    run.add_argument(
        "-n",
        type=_replies,
        default=1,
        metavar="N",
        help="write N replies to the prompt in one batch (1-16), printed when they end, with the batch's figures",
    )
    run.add_argument("--blocking", action="store_true", help="print nothing until the reply is complete")
    run.add_argument("--show-steps", action="store_true", help="print one line per step as it runs, then the text")
    run.add_argument(
        "--prediction",
        metavar="FILE",
        help="OpenAI's Predicted Outputs: a text file the reply is expected to be much like; its tokens are "
        "the drafts (speculative decoding, in place of --draft): the same reply, in fewer passes where it agrees",
    )
    run.add_argument(
        "--show-passes",
        action="store_true",
        help="with a draft (--draft): a line on stderr per verifying pass: the drafts it checked, kept and drew",
    )
    run.add_argument(
        "--show-stages",
        action="store_true",
        help="--show-steps with the sampler's waterfall under each step: what each stage removed and kept",
    )
    run.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="end the reply before this text, which is not printed (up to 4; also with --url)",
    )
    run.add_argument("--trace", metavar="FILE.jsonl", help="write every event as JSON lines (docs/trace-format.md)")
    run.add_argument(
        "--prompt-logprobs",
        action="store_true",
        help="print each prompt token's surprisal and the model's top guess there, and the prompt's "
        "perplexity, on stderr before the reply (a model run here)",
    )
    run.add_argument(
        "--score-only", action="store_true", help="--prompt-logprobs, and no reply: the prompt read, nothing written"
    )
    run.add_argument(
        "--watch",
        action="append",
        metavar="TEXT",
        help="follow this text's first token at every pass: its raw and sampled probability and rank, "
        "printed with --show-steps and recorded in --trace (up to 8; a model run here)",
    )
    run.add_argument(
        "--lens",
        action="store_true",
        help="print each pass's logit lens on stderr: what each layer would have said (a model run here)",
    )
    shape = run.add_mutually_exclusive_group()  # a constraint (issue 24): the reply follows it
    shape.add_argument("--grammar", metavar="FILE.gbnf", help="the reply follows this grammar (GBNF or Lark)")
    shape.add_argument("--json-schema", metavar="FILE.json", help="the reply is JSON that matches this schema")
    shape.add_argument("--json", action="store_true", help="the reply is a JSON object (any)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="loopchat",
        description="A terminal chat that shows the generation loop of a language model while it runs. "
        "With no command: open the chat.",
    )
    parser.add_argument("--version", action="version", version=f"loopchat {__version__}")
    _add_model_options(parser)
    _add_remote_options(parser)
    parser.add_argument(
        "--host",
        choices=("thread", "process"),
        help="where the chat runs the model: a thread of the app (the default: the faster on "
        "2 cores) or a child process (a crash inside llama.cpp then cannot take the app down)",
    )
    parser.add_argument(
        "--mode",
        choices=("chat", "completion"),
        help="open the chat in this mode: chat (messages through the chat template) or completion (a "
        "document the model continues, no template); default: the model's (models.toml's mode; a model "
        "with no chat template opens in completion mode); Ctrl+L switches",
    )
    parser.add_argument(
        "--no-history",
        action="store_true",
        help="keep nothing: this run's conversations are not stored (no history file is created or written)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    _add_run_parser(sub)

    models = sub.add_parser("models", help="list the configured models and the config file in use")
    models.add_argument("--config", metavar="PATH", help="models.toml to use", default=argparse.SUPPRESS)

    from loopchat.serve.command import add_serve_parser
    from loopchat.web.command import add_web_parser

    add_serve_parser(sub, _add_model_options)
    add_web_parser(sub, _add_model_options, _add_remote_options)

    replay = sub.add_parser("replay", help="play a recorded trace in the chat app")
    replay.add_argument("trace_file", metavar="FILE.jsonl")
    replay.add_argument("--speed", type=float, default=1.0, help="playback speed (2 = twice as fast; 0 = instant)")

    from loopchat.cli.history import add_history_parser

    add_history_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except UsageError as exc:
        print(f"loopchat: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("loopchat: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0


def entry() -> None:
    """The `loopchat` command (and `python -m loopchat`): `main`, then exit with its code.

    Interrupted, the process exits with os._exit(130) once its output is flushed: CPython
    3.11 turns the exit into a death by SIGINT (-2 to the parent, not 130) when the Ctrl+C
    landed inside an exec() of a string, which `dataclasses` runs to build each class's
    methods while modules load, even though main() caught the KeyboardInterrupt. Everything
    is closed by then (the backend, the trace): only the interpreter's teardown is skipped."""
    code = main()
    if code == EXIT_INTERRUPTED:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)


def _chat_draft_hint(argv: Sequence[str]) -> None:
    """The chat sets the draft in F2 or the palette; `run` and `serve` take it as a flag."""
    for arg in argv:
        if arg in ("run", "models", "serve", "web", "replay", "history"):
            return
        flag = arg.split("=", 1)[0]
        if flag in ("--draft", "--draft-max"):
            raise UsageError(
                f"the chat takes no {flag}: set it in F2 (the draft rows) or the palette (Draft: lookup), "
                f"or give it to `loopchat run {flag} ...` / `loopchat serve {flag} ...`"
            )


def _main(argv: Sequence[str] | None) -> int:
    from loopchat.config import ConfigError
    from loopchat.errors import EngineError
    from loopchat.model_files import ModelFileError
    from loopchat.settings import SettingsError
    from loopchat.trace import TraceError

    _chat_draft_hint(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            from loopchat.cli.run import run_command

            return run_command(args)
        if args.command == "models":
            from loopchat.config import format_models_listing, load_config

            print(format_models_listing(load_config(args.config)))
            return 0
        if args.command == "serve":
            from loopchat.serve.command import serve_command

            return serve_command(args)
        if args.command == "web":
            from loopchat.web.command import web_command

            return web_command(args)
        if args.command == "history":
            from loopchat.cli.history import history_command

            return history_command(args)
        if args.command == "replay":
            from loopchat.tui.launch import run_tui

            if args.speed < 0:
                raise UsageError("--speed must be 0 (instant) or more")
            return run_tui(config_path=None, model=None, replay=args.trace_file, replay_speed=args.speed)
        from loopchat.tui.launch import run_tui

        return run_tui(
            config_path=args.config,
            model=args.model,
            verbose=args.verbose,
            host=args.host,
            threads=args.threads,
            flash_attn=args.flash_attn,
            draft_model=args.draft_model,
            url=args.url,
            api_key=args.api_key,
            model_id=args.model_id,
            timeout=args.timeout,
            history=not args.no_history,
            mode=args.mode,
        )
    except (ConfigError, ModelFileError, EngineError, SettingsError, TraceError) as exc:
        print(f"loopchat: {exc}", file=sys.stderr)
        return EXIT_USAGE
