"""One rooted exception tree for the whole project.

Driver exceptions (redis, boto3, openai, anthropic, ray) are converted into these at the
boundary, so callers above the boundary handle *our* failures and never a driver's.
"""

from __future__ import annotations

import inspect
import os
import socket
import ssl
import sys
import traceback
from collections.abc import Iterator


class PunchlineError(Exception):
    """Root of every error punchline raises on purpose."""


# --- input ------------------------------------------------------------------------------------


class InputError(PunchlineError):
    """Bad user input: names the file, the record and the field so it can be fixed."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        record: str | int | None = None,
        field: str | None = None,
    ) -> None:
        self.file = file
        self.record = record
        self.field = field
        self.detail = message
        where = []
        if file is not None:
            where.append(f"file {file}")
        if record is not None:
            where.append(f"record {record}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class ConfigError(InputError):
    """A run configuration that cannot be decoded or is inconsistent."""


class ServiceRejected(ConfigError):
    """A service (Redis, S3, a provider) refused us for a reason waiting cannot fix: a wrong password
    or key, a TLS certificate that does not verify, an unknown host, a malformed URL. Not an outage:
    the run stops at once with one line naming the service and the setting to fix."""


# --- a pipeline's own code ------------------------------------------------------------------------


class PluginError(PunchlineError):
    """A pipeline's own code (its ``plan``, ``reduce``, ``headlines``...) raised something that is not ours: not
    a punchline bug, so the line names the pipeline, the stage and the ``file:line`` in the pipeline's code, and
    the CLI exits 1 with the command that resumes the run once it is fixed (everything committed is kept)."""

    def __init__(self, *, pipeline: str, stage: str, step: str, where: str, cause: str) -> None:
        self.pipeline = pipeline
        self.stage = stage
        self.step = step
        self.where = where
        self.cause = cause
        self.run_id: str | None = None  # set by the driver: the CLI prints the command that resumes it
        super().__init__(f"pipeline {pipeline!r}, stage {stage!r}: its {step} raised {cause} (at {where})")


def code_line(exc: BaseException, owner: type) -> str:
    """``file:line`` in the pipeline's code where ``exc`` came from: the innermost frame in ``owner``'s file (the
    stage's class), else the innermost frame outside punchline and the installed libraries, else the innermost."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown"
    try:
        own_file = os.path.realpath(inspect.getfile(owner))
    except (TypeError, OSError):
        own_file = ""
    ours = os.path.realpath(os.path.dirname(os.path.dirname(__file__)))  # the folder holding the layers
    libraries = tuple(os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})

    def user_code(filename: str) -> bool:
        real = os.path.realpath(filename)
        return not real.startswith(ours + os.sep) and not real.startswith(libraries)

    chosen = (
        next((f for f in reversed(frames) if own_file and os.path.realpath(f.filename) == own_file), None)
        or next((f for f in reversed(frames) if user_code(f.filename)), None)
        or frames[-1]
    )
    return f"{chosen.filename}:{chosen.lineno}"


# --- infrastructure ---------------------------------------------------------------------------


class InfraError(PunchlineError):
    """A service we depend on (Redis, the store, Ray) misbehaved."""


class LedgerUnavailable(InfraError):
    """Redis cannot be reached: no provider call may be made (fail closed)."""


class LedgerFailed(InfraError):
    """The run's own ledger died for good (a full disk, a server that will not start again): the run
    stops at once with one line instead of waiting out an outage that will not end."""


class StoreError(InfraError):
    """The checkpoint store (local folder or S3) failed."""


# --- providers ------------------------------------------------------------------------------


class ProviderError(PunchlineError):
    """A provider call failed; ``retryable`` says whether backing off may help."""

    retryable = False

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
        quoted_rpm: float | None = None,
    ) -> None:
        self.status = status
        self.retry_after_s = retry_after_s
        self.quoted_rpm = quoted_rpm  # the request limit a 429 quoted (x-ratelimit-limit-requests), per minute
        super().__init__(message)


class RetryableProviderError(ProviderError):
    """429, 5xx, timeouts, connection errors and malformed bodies."""

    retryable = True


class FatalProviderError(ProviderError):
    """400/401/403/404: retrying cannot help; the unit fails at once."""


class CacheMiss(PunchlineError):
    """Offline mode found no cached response for a request (names the request)."""


class BudgetExceeded(PunchlineError):
    """Scheduling one more unit would exceed ``--max-cost-usd``."""


# --- telling an outage from a mistake -------------------------------------------------------


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from (``__cause__``, else ``__context__``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


# getaddrinfo answers meaning "this name does not exist"; EAI_AGAIN (a DNS server down for a
# moment) is waited out like a refused connection
_NO_SUCH_HOST = {getattr(socket, n) for n in ("EAI_NONAME", "EAI_NODATA", "EAI_ADDRFAMILY") if hasattr(socket, n)}


def permanent_network_reason(exc: BaseException) -> str | None:
    """Why a connection failed for good (a TLS certificate that does not verify, a TLS handshake
    with a server that does not speak TLS, a host name that does not exist), or None when waiting
    may help (refused, reset, timed out)."""
    for e in causes(exc):
        if isinstance(e, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(e).upper():
            return "the server's TLS certificate does not verify"
        if isinstance(e, ssl.SSLError):
            return f"TLS handshake failed ({e.reason or e})"
        if isinstance(e, socket.gaierror) and e.errno in _NO_SUCH_HOST:
            return "unknown host (the name does not resolve)"
    return None
