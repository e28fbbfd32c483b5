"""The chat in a browser tab (`loopchat web`): the page's URL reaches each tab's process in
the environment, so the chat knows it runs in a browser, which keys to show first (the
browser keeps some for itself: tui/keys.py) and whether the browser will take a copy."""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

#: set by `loopchat web` for each tab's process: the URL the browser opened
WEB_URL_ENV = "LOOPCHAT_WEB_URL"

#: the chat's keys (Textual's names) that most browsers keep for themselves (a tab never
#: sees them), each with the second key that does the same there
BROWSER_KEYS: dict[str, str] = {"ctrl+t": "alt+t", "ctrl+n": "alt+n", "f5": "alt+r", "f11": "alt+l", "f12": "alt+s"}


def web_url() -> str | None:
    """The page's URL when this process runs a browser tab's chat, else None."""
    return os.environ.get(WEB_URL_ENV) or None


def shown_key(key: str) -> str:
    """A Textual key name as the chat writes it: ctrl+t -> Ctrl+T, f12 -> F12."""
    return "+".join(part.upper() if len(part) == 1 else part.capitalize() for part in key.split("+"))


def key_here(key: str) -> str:
    """`key` (Textual's name) as the chat's hints name it: in a browser tab, the key that
    works there (F12 -> Alt+S)."""
    return shown_key(BROWSER_KEYS.get(key, key) if web_url() else key)


def clipboard_allowed(url: str) -> bool:
    """Whether a browser lets the page write its clipboard (xterm.js takes the chat's copy
    and calls navigator.clipboard, which browsers give to secure pages only: https://, or
    http:// on this machine's own addresses)."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        return True
    host = parts.hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def browser_copy_refusal(url: str) -> str:
    """Why Ctrl+Y cannot copy in a tab on `url` (clipboard_allowed is false), and what to do."""
    return (
        f"Cannot copy here: browsers give their clipboard to https:// pages and to this machine's own "
        f"only, not to {url}. Select the text with the mouse (Shift+drag), or serve loopchat web "
        "behind https (--public-url)"
    )
