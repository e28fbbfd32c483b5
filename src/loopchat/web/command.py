"""`loopchat web`: the chat in a browser (textual-serve; server.py).

Start-up: the options are checked and the model looked up (a missing one fails here, in
one line, not in every tab), the port is bound, one line on stdout gives the URL to open.
Each tab then runs `python -m loopchat` with the chat's options in a process of its own:
its own model, its own conversation; the history file is shared (the store takes several
writers). Ctrl+C or SIGTERM tells every tab's chat to quit, then stops.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shlex
import socket
import sys
from collections.abc import Callable

from loopchat.arg_types import whole_number
from loopchat.config import API_KEY_ENV
from loopchat.errors import UsageError
from loopchat.listen import bind, port_number, socket_url

DEFAULT_PORT = 8000
DEFAULT_MAX_SESSIONS = 4


_sessions = whole_number(1, "{text}: --max-sessions is how many tabs may run at once, 1 or more")


def add_web_parser(
    sub: argparse._SubParsersAction,
    add_model_options: Callable[..., None],
    add_remote_options: Callable[..., None],
) -> None:
    web = sub.add_parser(
        "web",
        help="the chat in a browser: each tab runs it in a process of its own",
        description="Serve the chat to a browser (Textual's textual-serve: the same app, drawn by "
        "xterm.js). Each tab runs the chat with these options in a process of its own, with its own "
        "model and conversation; the history file is shared.",
    )
    web.add_argument(
        "--host",
        dest="bind",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="the address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every "
        "interface, and anyone on the network may then run models here)",
    )
    web.add_argument(
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        metavar="N",
        help=f"the port (default {DEFAULT_PORT}; 0 picks a free one, printed at start)",
    )
    web.add_argument(
        "--public-url",
        metavar="URL",
        help="the URL the browser sees, behind a reverse proxy (e.g. https://example.org/loopchat)",
    )
    web.add_argument(
        "--max-sessions",
        type=_sessions,
        default=DEFAULT_MAX_SESSIONS,
        metavar="N",
        help=f"tabs running the chat at once (default {DEFAULT_MAX_SESSIONS}; each loads the model): "
        "one more gets a page that says so",
    )
    add_model_options(web, sub=True)
    add_remote_options(web, sub=True)
    web.add_argument(
        "--mode", choices=("chat", "completion"), default=argparse.SUPPRESS, help="the chat's --mode, in each tab"
    )
    web.add_argument(
        "--no-history",
        action="store_true",
        default=argparse.SUPPRESS,
        help="the tabs keep nothing in the history file",
    )


def chat_command(args: argparse.Namespace) -> list[str]:
    """The command each tab runs: this Python's `loopchat` with the chat's options (the
    API key stays out of it: the tabs inherit it in the environment, which ps does not show)."""
    argv = [sys.executable, "-m", "loopchat"]
    for flag, name in (
        ("--config", "config"),
        ("--model", "model"),
        ("--threads", "threads"),
        ("--flash-attn", "flash_attn"),
        ("--url", "url"),
        ("--model-id", "model_id"),
        ("--timeout", "timeout"),
        ("--host", "host"),
        ("--mode", "mode"),
    ):
        value = getattr(args, name, None)
        if value is not None:
            argv += [flag, str(value)]
    if getattr(args, "verbose", False):
        argv.append("--verbose")
    if getattr(args, "no_history", False):
        argv.append("--no-history")
    return argv


def _check_model(args: argparse.Namespace) -> str:
    """The model the tabs will run (its name), looked up now: a bad --model or config fails
    at start, in one line."""
    if getattr(args, "url", None):
        from loopchat.urls import URLProblem, api_base

        try:
            return api_base(args.url)  # a malformed URL: one line now, not in every tab
        except URLProblem as exc:
            raise UsageError(f"--url: {exc}") from None
    from loopchat.config import load_config

    spec = load_config(getattr(args, "config", None)).get(getattr(args, "model", None))
    spec.resolve_file()
    return spec.name


def _open_to_the_network(sock: socket.socket) -> bool:
    host = sock.getsockname()[0]
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def web_command(args: argparse.Namespace) -> int:
    """Serve until Ctrl+C or SIGTERM; exit code 0 after a clean stop."""
    from loopchat.web.server import WebServer

    if getattr(args, "api_key", None) is not None:
        if not args.api_key.strip():
            raise UsageError("--api-key is empty: give it a key, or leave it out")
        os.environ[API_KEY_ENV] = args.api_key  # the tabs inherit it
    public_url = args.public_url.rstrip("/") if args.public_url else None
    if public_url is not None and not public_url.startswith(("http://", "https://")):
        raise UsageError(f"--public-url {args.public_url!r}: give a whole URL, starting with http:// or https://")
    model = _check_model(args)
    sock = bind(args.bind, args.port)
    url = public_url or socket_url(sock)
    command = shlex.join(chat_command(args))
    server = WebServer(command, sock, public_url=public_url, max_sessions=args.max_sessions, title=f"loopchat: {model}")
    if _open_to_the_network(sock):
        print(
            f"loopchat web: warning: listening on {args.bind}: anyone who can reach this machine can open "
            "the chat, run models on it and read its history (--host 127.0.0.1 keeps it to this machine)",
            file=sys.stderr,
            flush=True,
        )
    tabs = "1 tab" if args.max_sessions == 1 else f"up to {args.max_sessions} tabs"
    line = f"loopchat web: open {url} in a browser ({tabs} at once, {model}; Ctrl+C stops)"
    server.serve(on_listening=lambda: print(line, flush=True))
    print("loopchat web: stopped", file=sys.stderr, flush=True)
    return 0
