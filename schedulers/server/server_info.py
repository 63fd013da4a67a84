"""The embedded server's conversations held without a client library, over a bare socket: its identity (``INFO
server``: process id, run id), and at each of its starts, whether it is ours and ready, then the engine's scripts
loaded as the start's loader.

Why not redis-py: the runs folder's keeper (``services/redis_keeper.py``, a process of its own beside every local
run) holds these conversations. It asks ``INFO server`` once every two seconds; and it starts the server (and starts
it again after a crash), so it asks whether the server answers and loads its scripts. Through redis-py it paid
0.1 s more CPU to import redis, OpenTelemetry (which redis-py loads when it is installed) and structlog, and it
kept them in memory for the whole run (38 MB of RSS through a demo run, against 25 MB without). Each conversation
here is a handful of commands sent at once on one socket (``AUTH``, then ``INFO``/``PING`` or the ``SCRIPT LOAD``
of every script), and costs a millisecond.

Why this rather than a short-lived ``python -m`` child holding redis-py for the start: that child would pay the
interpreter's start and redis-py's import (about 0.2 s of CPU) at every start of the server, a restart too, and the
loader's password would have to travel to it; here the password never leaves the keeper's memory. It lives in
``schedulers/``, with the engine's other Redis conversations, so that the runs folder's modules
(``services/redis_folder.py``, ``services/redis_server.py``) manage processes and files and speak no protocol; what it
sends is the engine's own vocabulary (:mod:`punchline.schedulers.server.ledger_rules`: the scripts' texts).
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Sequence
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from punchline.schedulers.server.ledger_rules import engine_scripts

ANSWER_TIMEOUT_S = 1.0  # one question to a server that is starting: it answers at once or is not ready yet
LOAD_TIMEOUT_S = 5.0  # loading every script: a few milliseconds, on a machine busy with a run's start


class ReplyError(Exception):
    """The server answered a command with an error (``-WRONGPASS ...``, ``-NOPERM ...``, ``-LOADING ...``)."""


def _command(*words: str) -> bytes:
    """One command in RESP, the protocol's request form (an array of bulk strings)."""
    parts = [f"*{len(words)}\r\n".encode()]
    for word in words:
        data = word.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _reply(stream: BinaryIO) -> bytes | ReplyError:
    """One reply: a status's or a bulk string's bytes, or the error the server sent; ValueError for anything else
    (an array, a nil, or not Redis at all), OSError when the connection ends."""
    head = stream.readline()
    if not head.endswith(b"\r\n"):
        raise OSError("the connection ended mid-reply")
    if head.startswith(b"+"):
        return head[1:-2]
    if head.startswith(b"-"):
        return ReplyError(head[1:-2].decode(errors="replace"))
    if head.startswith(b"$"):
        size = int(head[1:])
        if size < 0:
            raise ValueError("a nil reply")
        body = stream.read(size + 2)
        if len(body) < size + 2:
            raise OSError("the connection ended mid-reply")
        return body[:size]
    raise ValueError("not a Redis reply")


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


def _ask(url: str, commands: Sequence[Sequence[str]], timeout_s: float) -> list[bytes | ReplyError] | None:
    """Send ``commands`` at once on one connection to the server at ``url`` (``redis://[user:password@]host:port/db``
    or ``unix://[user:password@]/path``), after an ``AUTH`` as the URL's user when it has a password; their replies
    in order (the AUTH's first), None for a URL of another form. OSError when nothing answers, ValueError when what
    answers does not speak Redis."""
    parts = urlsplit(url)
    auth = [unquote(w) for w in (parts.username, parts.password) if w] if parts.password else []
    requests = ([("AUTH", *auth)] if auth else []) + [tuple(words) for words in commands]
    sock = _connect(url, timeout_s)
    if sock is None:
        return None
    with sock, sock.makefile("rb") as stream:
        sock.sendall(b"".join(_command(*words) for words in requests))
        return [_reply(stream) for _ in requests]


def server_info(url: str, *, timeout_s: float = 2.0) -> dict[str, str] | None:
    """``INFO server`` of the Redis at ``url`` as a dict, None when nothing answers there, it refuses the password,
    or it does not speak Redis."""
    try:
        replies = _ask(url, [("INFO", "server")], timeout_s)
    except (OSError, ValueError):
        return None
    if replies is None or any(isinstance(r, ReplyError) for r in replies):
        return None
    return _info_fields(replies[-1])


def starting_server_id(url: str, pid: int) -> str | None:
    """The id (``INFO server``'s ``run_id``) of a server just started at ``url`` once it is our process ``pid``
    (another may own the port) and answers PING; None while it does not yet (not listening, replaying its AOF:
    ``-LOADING``, or another server there that does not know our password)."""
    try:
        replies = _ask(url, [("INFO", "server"), ("PING",)], ANSWER_TIMEOUT_S)
    except (OSError, ValueError):
        return None
    if replies is None or any(isinstance(r, ReplyError) for r in replies) or replies[-1] != b"PONG":
        return None
    info = _info_fields(replies[-2])
    return info.get("run_id", "") if info.get("process_id") == str(pid) else None


def _info_fields(reply: bytes | ReplyError) -> dict[str, str]:
    """An ``INFO`` reply's ``key:value`` lines as a dict (sections' ``#`` headers left out)."""
    if isinstance(reply, ReplyError):
        return {}
    info = {}
    for line in reply.decode(errors="replace").splitlines():
        key, sep, value = line.partition(":")
        if sep and not line.startswith("#"):
            info[key] = value
    return info


def load_scripts_as(url: str) -> str:
    """Load the engine's scripts (:func:`~punchline.schedulers.server.ledger_rules.engine_scripts`) on the server at
    ``url``, its loader user's URL: '' once the server holds every one (it answered each with the script's SHA-1),
    else why not."""
    texts = list(engine_scripts().values())
    try:
        replies = _ask(url, [("SCRIPT", "LOAD", text) for text in texts], LOAD_TIMEOUT_S)
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if replies is None:
        return "not a redis:// or unix:// URL"
    errors = [str(r) for r in replies if isinstance(r, ReplyError)]
    if errors:
        return errors[0]
    shas = [hashlib.sha1(text.encode()).hexdigest().encode() for text in texts]
    if replies[-len(texts) :] != shas:
        return "the server's SHA-1 of a script is not the script's"
    return ""
