"""What a browser tab of `loopchat web` costs, against the chat in a terminal (issue 27).

For each side, the same chat (`--threads 1`, the default model) gets the same message
`--replies` times, sides alternating reply by reply; for each reply the CPU time (user +
system, from /proc through psutil) of each process taking part is read before the
message is sent and after its reply's summary line is on screen, and divided by the
reply's tokens (the number in that summary line: prefill included in the CPU, so a
longer reply costs a little less per token):

- terminal: `loopchat` in tmux (140x40 cells: the browser tab's size; a tmux server of its
  own), and that tmux server, which draws it;
- browser: the tab's chat process (textual-serve's web driver, TEXTUAL_FPS=60 as
  textual-serve sets it), `loopchat web` itself (it relays the tab's bytes), and
  chromium's processes (xterm.js drawing; headless, --disable-gpu).

RSS (and USS: what a process alone holds; RSS also counts the model file's pages, shared
through the page cache by every process that maps it): each chat process after its
replies; `loopchat web`'s own; chromium's summed. Medians are printed.

    .venv/bin/python benchmarks/web_tab.py [--replies 5]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from web_browser import CHROMIUM, CHROMIUM_ARGS, HOOK, Web, open_tab, send, terminal_text, wait_until  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper and the sea."
SUMMARY = re.compile(r"(\d+) tokens · ([\d.]+) tok/s")
COLS, ROWS = 140, 40


def cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def rss_mb(procs: list[psutil.Process]) -> float:
    return sum(p.memory_info().rss for p in procs if p.is_running()) / 2**20


def uss_mb(procs: list[psutil.Process]) -> float:
    """Memory the processes alone hold (RSS counts the model file's pages, which every
    process mapping the file shares through the page cache)."""
    return sum(p.memory_full_info().uss for p in procs if p.is_running()) / 2**20


def summaries(text: str) -> list[tuple[int, float]]:
    return [(int(m.group(1)), float(m.group(2))) for m in SUMMARY.finditer(text)]


class Terminal:
    def __init__(self, home: Path) -> None:
        self.session = f"loopchat-bench-{int(time.time())}"
        env = f"LOOPCHAT_DATA_DIR={home}/data LOOPCHAT_CONFIG_DIR={home}/config LOOPCHAT_LOG_DIR={home}/log"
        subprocess.run(
            ["tmux", "-L", self.session, "new-session", "-d", "-s", self.session, "-x", str(COLS), "-y", str(ROWS)]
            + [f"env {env} {sys.executable} -m loopchat --threads 1"],
            check=True,
        )
        pane_pid = int(self._tmux("display-message", "-p", "-t", self.session, "#{pane_pid}").strip())
        self.shell = psutil.Process(pane_pid)
        self.server = psutil.Process(int(self._tmux("display-message", "-p", "#{pid}").strip()))
        wait_until("the terminal chat's model", lambda: "Enter sends" in self.text(), 90, self.text)
        self.chat = [
            p for p in [self.shell, *self.shell.children(recursive=True)] if "loopchat" in " ".join(p.cmdline())
        ]

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.session, *args], capture_output=True, text=True, check=True).stdout

    def text(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.session)

    def reply(self) -> tuple[int, float, float]:
        """(tokens, chat CPU s, tmux CPU s) of one reply, after a new conversation."""
        self._tmux("send-keys", "-t", self.session, "C-n")
        wait_until("a new conversation", lambda: not summaries(self.text()), 30, self.text)
        before = cpu(self.chat), cpu([self.server])
        self._tmux("send-keys", "-t", self.session, "-l", PROMPT)
        self._tmux("send-keys", "-t", self.session, "Enter")
        found = wait_until("the reply's summary", lambda: summaries(self.text()), 300, self.text)
        return found[-1][0], cpu(self.chat) - before[0], cpu([self.server]) - before[1]

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.session, "kill-server"], check=False)


class Tab:
    def __init__(self, home: Path, playwright: object) -> None:
        self.web = Web(home, max_tokens=None)  # the default model's own settings, as the terminal's
        self.context = playwright.chromium.launch_persistent_context(  # type: ignore[attr-defined]
            tempfile.mkdtemp(),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 720},
        )
        self.context.add_init_script(HOOK)
        self.page = open_tab(self.context, self.web.url)
        wait_until("the tab's model", lambda: "Enter sends" in terminal_text(self.page), 90)
        self.server = psutil.Process(self.web.proc.pid)
        self.chat = [p for p in self.server.children(recursive=True) if "loopchat" in " ".join(p.cmdline())]
        self.browser = [p for p in psutil.Process().children(recursive=True) if "chromium" in p.name()]

    def reply(self) -> tuple[int, float, float, float]:
        """(tokens, chat CPU s, loopchat web CPU s, chromium CPU s) of one reply."""
        self.page.keyboard.press("Alt+n")
        wait_until("a new conversation", lambda: not summaries(terminal_text(self.page)), 30)
        before = cpu(self.chat), cpu([self.server]), cpu(self.browser)
        send(self.page, PROMPT)
        found = wait_until("the reply's summary", lambda: summaries(terminal_text(self.page)), 300)
        after = cpu(self.chat), cpu([self.server]), cpu(self.browser)
        return found[-1][0], after[0] - before[0], after[1] - before[1], after[2] - before[2]

    def close(self) -> None:
        self.context.close()
        self.web.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replies", type=int, default=5)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    home = Path(tempfile.mkdtemp())
    term_rows: list[tuple[int, float, float]] = []
    tab_rows: list[tuple[int, float, float, float]] = []
    with sync_playwright() as pw:
        terminal = Terminal(home / "terminal")
        tab = Tab(home / "web", pw)
        try:
            for i in range(args.replies):
                term_rows.append(terminal.reply())
                tab_rows.append(tab.reply())
                print(f"reply {i + 1}: terminal {term_rows[-1]}, tab {tab_rows[-1]}", flush=True)
            print(
                f"RSS MB: terminal chat {rss_mb(terminal.chat):.0f}, tab chat {rss_mb(tab.chat):.0f}, "
                f"loopchat web {rss_mb([tab.server]):.0f}, chromium {rss_mb(tab.browser):.0f}"
            )
            print(
                f"USS MB: terminal chat {uss_mb(terminal.chat):.0f}, tab chat {uss_mb(tab.chat):.0f}, "
                f"loopchat web {uss_mb([tab.server]):.0f}, chromium {uss_mb(tab.browser):.0f}"
            )
        finally:
            terminal.close()
            tab.close()

    def per_token(rows: list, col: int) -> float:
        return statistics.median(r[col] / r[0] * 1000 for r in rows)

    print(
        f"tokens per reply (median): terminal {statistics.median(r[0] for r in term_rows)}, "
        f"tab {statistics.median(r[0] for r in tab_rows)}"
    )
    print(f"CPU ms per token (median): terminal chat {per_token(term_rows, 1):.2f}, tmux {per_token(term_rows, 2):.2f}")
    print(
        f"CPU ms per token (median): tab chat {per_token(tab_rows, 1):.2f}, loopchat web {per_token(tab_rows, 2):.2f}, "
        f"chromium {per_token(tab_rows, 3):.2f}"
    )
    print(f"tab chat / terminal chat: {per_token(tab_rows, 1) / per_token(term_rows, 1):.2f}")


if __name__ == "__main__":
    main()
