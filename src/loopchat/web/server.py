"""The chat in a browser: Textual's own `textual-serve` (each tab's websocket starts the chat
in a process of its own, its screen drawn by xterm.js), with loopchat's limits on it.

What loopchat changes in textual-serve's `Server`: it serves on a socket already bound
(a port in use fails at once, --port 0 works), prints one line on start instead of a
banner, logs one line per tab opened and closed, and bounds the tabs running at once
(`max_sessions`): the page of a tab over the limit says why (HTTP 503), and a tab whose
websocket arrives over the limit (two pages loaded at once) is told the same in its
terminal before it closes, never left waiting.
"""

from __future__ import annotations

import asyncio
import html
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from aiohttp import WSCloseCode, web
from textual_serve.app_service import AppService
from textual_serve.server import Server

from loopchat.browser import WEB_URL_ENV

BUSY_STATUS = 503


def busy_text(max_sessions: int) -> str:
    """What a tab over the limit is told (the page, or its terminal)."""
    tabs = "1 tab" if max_sessions == 1 else f"{max_sessions} tabs"
    return (
        f"loopchat web is busy: {tabs} already run the chat, the most this server allows "
        f"(--max-sessions {max_sessions}; each tab runs a model of its own). "
        "Close one of them, then reload this page."
    )


def busy_page(max_sessions: int) -> str:
    text = html.escape(busy_text(max_sessions))
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>loopchat web: busy</title></head>"
        "<body style='background:#0c181f;color:#eee;font-family:monospace;padding:2em'>"
        f"<h1>loopchat web is busy</h1><p id='busy'>{text}</p></body></html>"
    )


def _log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def _int(text: str | None, default: int) -> int:
    try:
        return int(text or "")
    except ValueError:
        return default


class TabService(AppService):
    """One tab's chat process (textual-serve's), told the page's URL (browser.WEB_URL_ENV)."""

    def __init__(self, command: str, *, page_url: str, **kwargs: Any) -> None:
        super().__init__(command, **kwargs)
        self.page_url = page_url

    def _build_environment(self, width: int = 80, height: int = 24) -> dict[str, str]:
        return {**super()._build_environment(width, height), WEB_URL_ENV: self.page_url}

    async def stop(self) -> None:
        """Tell the chat to quit, then wait for its process to end (QUIT_WAIT_S at most).
        textual-serve's stop returns once the chat's output has ended, while the chat may still
        be releasing its model: a server stopped with a tab open exited before its chat had."""
        await super().stop()
        process = self._process  # (textual-serve's: the chat's shell)
        if process is not None and process.returncode is None:
            try:
                await asyncio.wait_for(process.wait(), QUIT_WAIT_S)
            except TimeoutError:
                _log(f"a tab's chat (pid {process.pid}) has not quit after {QUIT_WAIT_S:.0f} s: left running")


#: how long a tab's stop waits for its chat's process to end
QUIT_WAIT_S = 10.0


class WebServer(Server):
    """textual-serve's server on `sock`, at most `max_sessions` tabs at once."""

    def __init__(
        self, command: str, sock: socket.socket, *, public_url: str | None, max_sessions: int, title: str
    ) -> None:
        host, port = sock.getsockname()[:2]
        super().__init__(command, host=host, port=port, title=title, public_url=public_url)
        self.sock = sock
        self.fixed_url = public_url  # else each page's URLs are those the browser used
        self.max_sessions = max_sessions
        self.sessions = 0  # tabs whose chat process runs
        self.opened = 0  # tabs opened since the start (numbers them in the log)
        self.open_sockets: set[web.WebSocketResponse] = set()

    def initialize_logging(self) -> None:
        """No banner and no access log: the lines loopchat prints are its own."""

    async def on_startup(self, app: web.Application) -> None:
        """(the start line is printed by the command once the socket listens)"""

    async def on_shutdown(self, app: web.Application) -> None:
        """Ctrl+C or SIGTERM: every tab's websocket is closed, so each tab's chat is told to
        quit at once (aiohttp would otherwise wait for them until its shutdown timeout)."""
        for websocket in list(self.open_sockets):
            await websocket.close(code=WSCloseCode.GOING_AWAY, message=b"loopchat web stopped")

    async def handle_index(self, request: web.Request) -> web.StreamResponse:
        if self.sessions >= self.max_sessions:
            _log(f"a tab turned away: {self.sessions} of {self.max_sessions} sessions in use")
            return web.Response(text=busy_page(self.max_sessions), status=BUSY_STATUS, content_type="text/html")
        if self.fixed_url is None:  # (no await before super() reads it: no other page in between)
            self.public_url = f"{request.scheme}://{request.host}"
        response: web.StreamResponse = await super().handle_index(request)
        return response

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        """A tab's websocket: its chat in a process of its own while it is open
        (textual-serve's handler, with the limit and the page's URL for the chat)."""
        websocket = web.WebSocketResponse(heartbeat=15)
        await websocket.prepare(request)
        if self.sessions >= self.max_sessions:
            await websocket.send_bytes(("\r\n  " + busy_text(self.max_sessions) + "\r\n").encode())
            await websocket.close()
            _log(f"a tab turned away: {self.sessions} of {self.max_sessions} sessions in use")
            return websocket
        self.sessions += 1
        self.open_sockets.add(websocket)
        self.opened += 1
        number = self.opened
        _log(f"tab {number} opened ({self.sessions} of {self.max_sessions} sessions)")
        service = TabService(
            self.command,
            page_url=self.fixed_url or f"{request.scheme}://{request.host}",
            write_bytes=websocket.send_bytes,
            write_str=websocket.send_str,
            close=websocket.close,
            download_manager=self.download_manager,
        )
        try:
            await service.start(_int(request.query.get("width"), 80), _int(request.query.get("height"), 24))
            await self._process_messages(websocket, service)
        except asyncio.CancelledError:
            await websocket.close()
        except Exception as exc:  # (textual-serve's handler logs it too) the tab closes; the server goes on
            _log(f"tab {number}: {type(exc).__name__}: {exc}")
        finally:
            await service.stop()
            self.open_sockets.discard(websocket)
            self.sessions -= 1
            _log(f"tab {number} closed ({self.sessions} of {self.max_sessions} sessions)")
        return websocket

    def serve(self, debug: bool = False, on_listening: Callable[[], None] = lambda: None) -> None:
        """Serve until Ctrl+C or SIGTERM (textual-serve's handlers: a graceful exit that
        tells every tab's app to quit). `on_listening`: called once the socket listens and
        the signals are handled (a SIGTERM right after the start line stops cleanly)."""
        import signal

        from aiohttp.web_runner import GracefulExit

        def leave() -> None:
            raise GracefulExit()

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, leave)
        self.sock.listen(128)
        on_listening()
        web.run_app(self._make_app(), sock=self.sock, handle_signals=False, loop=loop, print=lambda *args: None)
