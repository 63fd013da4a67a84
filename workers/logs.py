"""Structured logs: JSON lines for machines (``runs/<run-id>/log.jsonl``), readable lines for people.

Every process of a run (driver and Ray actors, possibly on other nodes sharing the folder) calls
``configure_logging`` with the same file and appends to it through its own ``O_APPEND`` descriptor,
one ``write(2)`` per line. Appends of a whole line land at the end of the file without
interleaving with other writers; lines are capped at ``MAX_LINE_BYTES`` (long values are cut in
the middle) so this holds even on filesystems that only guarantee it for small writes. Each
line carries ``pid`` and ``host`` so lines from different processes can be told apart.

Secrets never reach a sink: values of fields named like credentials are replaced by ``***`` and
anything shaped like an API key (``sk-...``, ``sk-ant-...``, ``AKIA...``, ``Bearer ...``,
passwords in URLs) is masked wherever it appears, the event text included.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import sys
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, WrappedLogger

from punchline.data.redaction import redact_text
from punchline.data.storage.run_layout import LOG

MAX_LINE_BYTES = 4000
REDACTED = "***"

# Field names whose values are secrets. "key" alone is common and harmless in this project
# (store keys, cache keys), so plain *key* names are redacted unless listed in SAFE_KEY_NAMES.
_SECRET_NAME = re.compile(r"(?i)(token|secret|passw(or)?d|pwd|credential|authorization|api[_-]?key|private[_-]?key)")
_KEYISH_NAME = re.compile(r"(?i)key")
SAFE_KEY_NAMES = frozenset(
    {
        "key",
        "keys",
        "cache_key",
        "store_key",
        "unit_key",
        "shard_key",
        "sort_key",
        "lease_key",
        "redis_key",
        "key_prefix",
        "batch_key",  # a hash of a batch's request keys (schedulers/batches.py)
        "request_key",
    }
)


def is_secret_name(name: str) -> bool:
    if _SECRET_NAME.search(name):
        return True
    return bool(_KEYISH_NAME.search(name)) and name.lower() not in SAFE_KEY_NAMES


def _redact(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if depth > 6:
        return value
    if isinstance(value, dict):
        return {
            k: (REDACTED if isinstance(k, str) and is_secret_name(k) and v not in (None, "") else _redact(v, depth + 1))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return type(value)(_redact(v, depth + 1) for v in value)
    return value


def redact_secrets(logger: WrappedLogger, method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: see the module docstring."""
    redacted = _redact(dict(event_dict))
    assert isinstance(redacted, dict)
    return redacted


def _add_process(logger: WrappedLogger, method: str, event_dict: EventDict) -> EventDict:
    event_dict.setdefault("pid", os.getpid())
    event_dict.setdefault("host", _HOST)
    name = getattr(logger, "name", None)
    if name:
        event_dict.setdefault("logger", name)
    return event_dict


_HOST = socket.gethostname()


def _fit_line(event_dict: dict[str, Any]) -> str:
    """One JSON line of at most MAX_LINE_BYTES: cut the longest strings in the middle (tracebacks
    keep their head and their tail, where the error is)."""
    line = json.dumps(event_dict, default=repr, ensure_ascii=False)
    for _ in range(12):
        excess = len(line.encode()) - MAX_LINE_BYTES
        if excess <= 0:
            return line
        name, longest = max(
            ((k, v) for k, v in event_dict.items() if isinstance(v, str)), key=lambda kv: len(kv[1]), default=("", "")
        )
        if len(longest) <= 64:
            break
        keep = max(32, len(longest) - excess - 64)
        head = keep // 3
        event_dict[name] = (
            f"{longest[:head]}…[{len(longest) - keep} chars cut]…{longest[len(longest) - (keep - head) :]}"
        )
        event_dict["truncated"] = True
        line = json.dumps(event_dict, default=repr, ensure_ascii=False)
    # Pathological (many long fields): keep only what identifies the event.
    slim = {k: event_dict.get(k) for k in ("timestamp", "level", "logger", "pid", "host")}
    slim["event"] = str(event_dict.get("event", ""))[:1000]
    slim["truncated"] = True
    return json.dumps(slim, default=repr, ensure_ascii=False)


class _Sinks:
    """Where rendered lines go: an O_APPEND file descriptor and/or a console stream."""

    def __init__(self, json_path: Path | None, console: TextIO | None, colors: bool) -> None:
        self.fd: int | None = None
        self.json_path = json_path
        if json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            # never through a link (a run's log is checked before the run starts; this is the last line of defence)
            self.fd = os.open(json_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        self.console = console
        self.console_renderer = structlog.dev.ConsoleRenderer(colors=colors) if console is not None else None
        self.format_exc = structlog.processors.format_exc_info

    def render(self, logger: WrappedLogger, method: str, event_dict: EventDict) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.fd is not None:
            as_json = dict(self.format_exc(logger, method, dict(event_dict)))
            if isinstance(as_json.get("exception"), str):
                as_json["exception"] = redact_text(as_json["exception"])
            out["json_line"] = _fit_line(as_json)
        if self.console_renderer is not None:
            console_dict = {k: v for k, v in event_dict.items() if k not in ("pid", "host")}
            rendered = self.console_renderer(logger, method, console_dict)
            out["console_line"] = redact_text(str(rendered))
        return out

    def write(self, json_line: str | None = None, console_line: str | None = None) -> None:
        if json_line is not None and self.fd is not None:
            with contextlib.suppress(OSError):  # a full disk must not crash the worker
                os.write(self.fd, (json_line + "\n").encode())
        if console_line is not None and self.console is not None:
            with contextlib.suppress(OSError, ValueError):
                self.console.write(console_line + "\n")
                self.console.flush()

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


class _SinkLogger:
    """The structlog "wrapped logger": every level method writes the pre-rendered lines."""

    def __init__(self, sinks: _Sinks, name: str | None) -> None:
        self._sinks = sinks
        self.name = name

    def msg(self, **lines: str) -> None:
        self._sinks.write(**lines)

    debug = info = warning = warn = error = critical = fatal = exception = log = msg


_active: dict[str, _Sinks] = {}
_listeners: list[Callable[[Mapping[str, Any]], None]] = []


def add_listener(fn: Callable[[Mapping[str, Any]], None]) -> Callable[[], None]:
    """``fn`` sees every event this process logs from now on (redacted, before it is written; whatever the
    configuration): the progress display shows the phase a run is in from them. Returns its removal."""
    _listeners.append(fn)
    return lambda: _listeners.remove(fn) if fn in _listeners else None


def _tell_listeners(logger: WrappedLogger, method: str, event_dict: EventDict) -> EventDict:
    for fn in list(_listeners):
        with contextlib.suppress(Exception):  # a display's bug never stops a log line
            fn(event_dict)
    return event_dict


def _level_number(level: int | str) -> int:
    if isinstance(level, int):
        return level
    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r}")
    return number


def configure_logging(
    run_dir: str | os.PathLike[str] | None,
    *,
    console: bool = True,
    level: int | str = "INFO",
    json_path: str | os.PathLike[str] | None = None,
    console_stream: TextIO | None = None,
    stdlib: bool = True,
) -> Path | None:
    """Configure structlog for this process; call again to reconfigure (the old file is closed).

    JSON lines go to ``json_path`` or, if not given, ``<run_dir>/log.jsonl`` (neither: no file).
    ``console`` adds human-readable lines on stderr (colours only on a terminal). With ``stdlib``,
    records from ``logging`` (libraries) at WARNING and above pass through the same sinks.
    Returns the JSON file's path.
    """
    path: Path | None = None
    if json_path is not None:
        path = Path(json_path)
    elif run_dir is not None:
        path = Path(run_dir) / LOG
    stream = (console_stream or sys.stderr) if console else None
    colors = bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())
    sinks = _Sinks(path, stream, colors)
    old = _active.pop("sinks", None)
    _active["sinks"] = sinks
    if old is not None:
        old.close()

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _add_process,
            structlog.processors.StackInfoRenderer(),
            redact_secrets,
            _tell_listeners,
            sinks.render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_level_number(level)),
        logger_factory=lambda *args: _SinkLogger(sinks, str(args[0]) if args else None),
        cache_logger_on_first_use=False,  # loggers made at import time must follow reconfiguration
    )
    if stdlib:
        _route_stdlib(max(_level_number(level), logging.WARNING))
    return path


class _StdlibBridge(logging.Handler):
    """Library warnings (boto3, urllib3, ray client...) into our sinks, redacted like ours."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            log = structlog.get_logger(record.name)
            method = record.levelname.lower() if record.levelname.lower() in _METHODS else "warning"
            extra: dict[str, Any] = {}
            if record.exc_info:
                extra["exc_info"] = record.exc_info
            getattr(log, method)(record.getMessage(), **extra)
        except Exception:
            self.handleError(record)


_METHODS = ("debug", "info", "warning", "error", "critical")


def _route_stdlib(level: int) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _StdlibBridge):
            root.removeHandler(handler)
    bridge = _StdlibBridge(level)
    root.addHandler(bridge)
    if root.level > level or root.level == logging.NOTSET:
        root.setLevel(level)


def reset_logging() -> None:
    """Back to structlog's defaults: close our file, detach from ``logging`` (tests, embedding)."""
    old = _active.pop("sinks", None)
    if old is not None:
        old.close()
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _StdlibBridge):
            root.removeHandler(handler)
    structlog.reset_defaults()


def get_logger(name: str | None = None, **bound: Any) -> Any:
    """A structlog logger with ``bound`` fields on every line (``run_id=``, ``stage=``...)."""
    log = structlog.get_logger(name) if name else structlog.get_logger()
    return log.bind(**bound) if bound else log


def read_log(path: str | os.PathLike[str]) -> Iterable[dict[str, Any]]:
    """The events of a ``log.jsonl``, skipping a torn last line (a process killed mid-write)."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            with contextlib.suppress(json.JSONDecodeError):
                event = json.loads(line)
                if isinstance(event, MutableMapping):
                    yield dict(event)
