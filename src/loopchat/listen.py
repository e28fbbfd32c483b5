"""A listening socket for the servers (`loopchat serve`, `loopchat web`): the port is bound
first, so a port in use fails at once with one line, and --port 0 gets a free one whose
URL is then printed."""

from __future__ import annotations

import argparse
import socket

from loopchat.errors import UsageError


def port_number(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to 65535; 0 picks a free port)") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0 to 65535; 0 picks a free port)")
    return port


def bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(
            f"cannot listen on {host!r}: {exc.strerror}; give --host an address such as 127.0.0.1"
        ) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        hint = "pick another --port (0 picks a free one)" if exc.errno in (98, 48) else "check --host and --port"
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}; {hint}") from None
    sock.set_inheritable(False)
    return sock


def socket_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
