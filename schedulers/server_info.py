"""``INFO server`` of a Redis over a bare socket: the embedded server's identity (process id, run id), asked
without a client library.

Why not redis-py: the runs folder's keeper (``services/redis_keeper.py``, a process of its own beside
every local run) asks this once every two seconds. Through redis-py it paid a quarter of a CPU second a run to
import redis, OpenTelemetry (which redis-py loads when it is installed) and structlog; one ``AUTH`` and one ``INFO
server`` over a socket cost a millisecond. It lives here, with the engine's other Redis conversations, so that the
runs folder's modules (``services/redis_folder.py``) manage processes and files and speak no protocol.
"""

from __future__ import annotations

import socket
from typing import BinaryIO
from urllib.parse import unquote, urlsplit


def _command(*words: str) -> bytes:
    """One command in RESP, the protocol's request form (an array of bulk strings)."""
    parts = [f"*{len(words)}\r\n".encode()]
    for word in words:
        data = word.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _reply(stream: BinaryIO) -> bytes | None:
    """One reply: a status or a bulk string's bytes; None for an error or anything else."""
    head = stream.readline()
    if head.startswith(b"+"):
        return head[1:].rstrip(b"\r\n")
    if head.startswith(b"$"):
        size = int(head[1:])
        if size < 0:
            return None
        body = b""
        while len(body) < size + 2:
            chunk = stream.read(size + 2 - len(body))
            if not chunk:
                return None
            body += chunk
        return body[:size]
    return None  # "-ERR ..." (a wrong password, a command refused) or not Redis at all


def _connect(url: str, timeout_s: float) -> socket.socket | None:
    """A socket to the server at ``url`` (``redis://host:port/db`` or ``unix:///path``), None for another form."""
    parts = urlsplit(url)
    if parts.scheme == "unix" and parts.path:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect(parts.path)
        except OSError:
            sock.close()
            raise
        return sock
    if parts.scheme == "redis" and parts.hostname:
        return socket.create_connection((parts.hostname, parts.port or 6379), timeout=timeout_s)
    return None


def server_info(url: str, *, timeout_s: float = 2.0) -> dict[str, str] | None:
    """``INFO server`` of the Redis at ``url`` (``redis://[user:password@]host:port/db`` or
    ``unix://[:password@]/path``) as a dict, None when nothing answers there, it refuses the password, or it does
    not speak Redis."""
    parts = urlsplit(url)
    words = [unquote(w) for w in (parts.username, parts.password) if w]
    try:
        sock = _connect(url, timeout_s)
        if sock is None:
            return None
        with sock, sock.makefile("rb") as stream:
            sock.sendall((_command("AUTH", *words) if parts.password else b"") + _command("INFO", "server"))
            if parts.password and _reply(stream) is None:
                return None
            text = _reply(stream)
    except (OSError, ValueError):
        return None
    if text is None:
        return None
    info = {}
    for line in text.decode(errors="replace").splitlines():
        key, sep, value = line.partition(":")
        if sep and not line.startswith("#"):
            info[key] = value
    return info
