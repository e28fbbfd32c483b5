"""`loopchat history`: the stored conversations for scripts (list, show, export, import,
delete, rename). Bad input or a store that cannot be used: one line on stderr, exit 2.

    loopchat history list [--search TEXT] [--json]   one line per conversation:
                                                     id, date, model, replies, title (tab-separated)
    loopchat history                                 the same as `loopchat history list`
    loopchat history show ID                         the conversation as Markdown
    loopchat history export ID -o FILE [--format md|trace|json]
    loopchat history import FILE.jsonl [--title T]   prints the new conversation's id
    loopchat history delete ID [--yes]               asks y/N on a terminal; elsewhere needs --yes
    loopchat history rename ID TITLE

`--store PATH` uses another history file than the platform's (default_store_path()).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from loopchat.arg_types import whole_number
from loopchat.errors import UsageError

FORMATS = {"md": ".md", "trace": ".jsonl", "json": ".json"}


_id = whole_number(1, "not a conversation id: {text}, a number from `loopchat history list`")


def add_history_parser(sub: Any) -> None:
    history = sub.add_parser(
        "history", help="the stored conversations: list (the default), show, export, import, delete, rename"
    )
    store_help = "the history file to use (default: history.sqlite3 in the platform's data folder)"
    history.add_argument("--store", metavar="PATH", help=store_help)
    actions = history.add_subparsers(dest="history_command", metavar="ACTION", parser_class=type(history))
    history.set_defaults(search="", limit=1000, json=False)  # no action: list, as `llm logs` does

    def action(name: str, help: str) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help)
        p.add_argument("--store", metavar="PATH", help=store_help, default=argparse.SUPPRESS)
        return p

    p = action("list", "one line per conversation, newest first: id, date, model, replies, title")
    p.add_argument(
        "--search", metavar="TEXT", default="", help="only conversations whose messages or title hold every word"
    )
    p.add_argument("--limit", type=int, default=1000, metavar="N", help="at most N lines (default 1000)")
    p.add_argument("--json", action="store_true", help="one JSON array instead of lines")
    p = action("show", "print a conversation as Markdown (its most recent branch)")
    p.add_argument("id", type=_id, metavar="ID")
    p = action("export", "write a conversation to a file (atomically)")
    p.add_argument("id", type=_id, metavar="ID")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the file to write")
    p.add_argument(
        "--format",
        choices=tuple(FORMATS),
        help="md: the conversation as text; trace: loopchat replay plays it; json: the whole tree "
        "(default: from FILE's extension, .md / .jsonl / .json)",
    )
    p = action("import", "store a trace file (loopchat run --trace, or an export) as a new conversation")
    p.add_argument("trace_file", metavar="FILE.jsonl")
    p.add_argument("--title", metavar="TITLE", help="the conversation's title (default: its first message)")
    p = action("delete", "delete a conversation and every reply in it")
    p.add_argument("id", type=_id, metavar="ID")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask")
    p = action("rename", "give a conversation another title")
    p.add_argument("id", type=_id, metavar="ID")
    p.add_argument("title", metavar="TITLE")


def _date(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _format(args: argparse.Namespace) -> str:
    if args.format:
        return args.format
    suffix = Path(args.output).suffix.lower()
    for name, ext in FORMATS.items():
        if suffix == ext:
            return name
    raise UsageError(f"say which format to write {args.output} in: --format md, trace or json")


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        raise UsageError("delete asks for a confirmation on a terminal: add --yes to delete from a script")
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def history_command(args: argparse.Namespace) -> int:
    from loopchat.history.store import ConversationStore, StoreError, default_store_path

    path = Path(args.store).expanduser() if args.store else default_store_path()
    action = args.history_command = args.history_command or "list"
    if action == "export":
        fmt = _format(args)
    if action in ("list", "show", "export", "delete", "rename") and not path.exists():
        # nothing stored yet: no file is made for a command that only reads or changes one
        if action == "list":
            print("[]" if args.json else "", end="\n" if args.json else "")
            return 0
        raise UsageError(f"no conversation {args.id}: {path} holds no history yet")
    try:
        store = ConversationStore.open(path)
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    if store.notice:  # a history file others could read is now 0600: said once
        print(f"loopchat: {store.notice}", file=sys.stderr)
    try:
        return _run(store, args, fmt if action == "export" else "")
    except KeyError:
        raise UsageError(f"no conversation {args.id} (see `loopchat history list`)") from None
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    finally:
        store.close()


def _run(store: Any, args: argparse.Namespace, fmt: str) -> int:
    from loopchat.chat.export import export_json, export_markdown, export_trace, import_trace, to_markdown

    action = args.history_command
    if action == "list":
        found = store.list_conversations(args.search, limit=max(args.limit, 0))
        if args.json:
            print(json.dumps([s.__dict__ for s in found], ensure_ascii=False, indent=1))
            return 0
        for s in found:
            replies = f"{s.replies}" + (f" ({s.cut} cut)" if s.cut else "")
            title = " ".join(s.title.split())
            print(f"{s.id}\t{_date(s.updated)}\t{s.model_name}\t{replies}\t{title}")
        return 0
    if action == "show":
        sys.stdout.write(to_markdown(store.load(args.id)))
        return 0
    if action == "export":
        conv = store.load(args.id)
        {"md": export_markdown, "trace": export_trace, "json": export_json}[fmt](conv, args.output)
        print(f"conversation {args.id} written to {args.output} ({fmt})", file=sys.stderr)
        return 0
    if action == "import":
        conv_id = import_trace(store, args.trace_file, title=args.title)
        print(conv_id)  # (its id alone on stdout, for a script; the sentence for a person)
        print(f"{args.trace_file} stored as conversation {conv_id}", file=sys.stderr)
        return 0
    if action == "delete":
        summary = store.summary(args.id)
        if not args.yes and not _confirm(
            f"delete conversation {summary.id} “{summary.title}” ({summary.replies} replies)?"
        ):
            print("nothing deleted", file=sys.stderr)
            return 1
        store.delete(args.id)
        print(f"deleted conversation {args.id}", file=sys.stderr)
        return 0
    if action == "rename":
        if not args.title.strip():
            raise UsageError("a title cannot be empty")
        store.rename(args.id, args.title)
        return 0
    raise UsageError(f"unknown action {action}")  # argparse keeps this from happening
