"""Secrets out of text: URL passwords (``user:pw@``, ``?password=``, ``?token=``...), API keys, bearer tokens.

The ground floor's one spelling of what a secret looks like in free text, so every floor redacts the same way:
the CLI's last-resort error line (without importing the logging or Redis stack), the logs' processor
(``workers/logs.py``), the ledger's URLs (``schedulers/server/redis_client.py``) and the run record's config.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_USERINFO = re.compile(r"(?P<head>^[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*):[^@\s]*@")
# A query parameter in free text (a URL, a command line): ``?name=value`` or ``&name=value``.
_QUERY_PARAM = re.compile(r"(?P<head>[?&;](?P<name>[A-Za-z0-9_.\-]+)=)(?P<value>[^&;#\s'\"]*)")
# Words that make a query parameter's value a secret (redis-py reads ``?password=``; other clients take
# tokens, keys, signatures the same way). Matched on the name's words, so ``ssl_keyfile`` (a path) is not one.
_SECRET_WORDS = frozenset(
    {"password", "passwd", "pass", "pwd", "token", "secret", "key", "apikey", "auth", "credential", "credentials",
     "signature", "sig"}
)  # fmt: skip
REDACTED = "***"


def is_secret_param(name: str) -> bool:
    """Whether a URL query parameter of this name carries a secret (``password``, ``auth_token``, ``api-key``...)."""
    lowered = name.lower()
    words = [w for w in re.split(r"[^a-z0-9]+", lowered) if w]
    return any(w in _SECRET_WORDS for w in words) or lowered.endswith(("password", "token", "secret", "apikey"))


def secret_parts(url: str) -> list[str]:
    """What in a URL is a secret, by name: ``password`` (the userinfo's) and every secret query parameter."""
    found = ["password"] if _USERINFO.search(url) else []
    return found + [m.group("name") for m in _QUERY_PARAM.finditer(url) if is_secret_param(m.group("name"))]


def redact_query(text: str) -> str:
    """``text`` with the value of every secret-named query parameter replaced by ``***`` (any free text)."""

    def mask(m: re.Match[str]) -> str:
        secret = is_secret_param(m.group("name")) and m.group("value")
        return f"{m.group('head')}{REDACTED}" if secret else m.group(0)

    return _QUERY_PARAM.sub(mask, text)


def redact_url(url: str) -> str:
    """The URL with any password (``user:PASSWORD@`` or ``?password=``, ``?token=``...) replaced by ``***``
    (safe for logs and reprs), even when the URL is too malformed to parse."""
    url = redact_query(url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a bad port: fall back to the pattern)
    except ValueError:
        return _USERINFO.sub(lambda m: f"{m.group('head')}:{REDACTED}@", url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{host}"))


_ANY_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]{0,15}://[^:/@\s\"']*):[^@\s\"'/]*@")


def redact_urls(text: str) -> str:
    """``text`` (a config file, a message) with the password of every URL in it shown as ``***``."""
    return _ANY_USERINFO.sub(lambda m: f"{m.group('head')}:***@", text)


_SECRET_VALUE = re.compile(
    r"sk-ant-[A-Za-z0-9_\-]{8,}"  # Anthropic
    r"|sk-(?:proj-|svcacct-)?[A-Za-z0-9_\-]{16,}"  # OpenAI and look-alikes
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key ids
    r"|gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub
    r"|hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|AIza[0-9A-Za-z_\-]{30,}"  # Google
    r"|xox[abprs]-[A-Za-z0-9\-]{10,}"  # Slack
)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{8,}")
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.\-]{0,15}://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)@", re.I)


def redact_text(text: str) -> str:
    """Mask key-shaped substrings, bearer tokens and URL passwords (userinfo or query) in free text."""
    text = _SECRET_VALUE.sub(REDACTED, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = redact_query(text)  # ?password=, ?token=, ... in a URL
    return _URL_PASSWORD.sub(lambda m: f"{m.group('scheme')}{m.group('user')}:{REDACTED}@", text)
