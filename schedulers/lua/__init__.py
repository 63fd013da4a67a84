"""The engine's Redis Lua scripts, one ``.lua`` file each, read from the package (they ship in the wheel as
package data, ``pyproject.toml``).

Why files: a script is a program of its own, in its own language; in a file it reads (and is reviewed) as
one, and a module that runs it says only which. A file starts with a header of ``--`` lines saying what
its KEYS and ARGV are and what it returns; the header is not sent to Redis, so a script's text (and its
SHA) is only its code. A header line ``-- needs: gcra, budget`` names libraries (files of ``local function``
definitions: ``gcra.lua``, the rate limiter's cells; ``budget.lua``, a run's cost budget) that
:func:`script` puts before the body, so one script can reserve a rate slot, a cost and a lease in one
round trip. Nothing here talks to Redis: each module registers the scripts it runs on its own client.

No script deletes a key with ``DEL``: Redis checks a script's calls against the ACL of the user who runs it, and
the run's user may not delete (:mod:`punchline.schedulers.server.ledger_access`). A script removes a key with ``PEXPIRE
key 0`` instead: an expiry that is not in the future deletes the key at once (the AOF records it as an ``UNLINK``,
which a replay does not check against any ACL).
The server holds them because its loader loaded them (every start of the embedded server does), not because a
client sent them: a run's client runs them with ``EVALSHA`` only.
"""

from __future__ import annotations

from importlib import resources

NEEDS = "-- needs:"


def _file(name: str) -> str:
    return resources.files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")


def _split(text: str) -> tuple[list[str], str]:
    """The libraries a file's header names, and its code (the file without its header)."""
    lines = text.splitlines(keepends=True)
    needs: list[str] = []
    while lines and lines[0].startswith("--"):
        head = lines.pop(0)
        if head.startswith(NEEDS):
            needs += [n.strip() for n in head[len(NEEDS) :].split(",") if n.strip()]
    return needs, "".join(lines)


def needs(name: str) -> list[str]:
    """The libraries script ``name`` names in its header, in order."""
    return _split(_file(name))[0]


def script(name: str) -> str:
    """The text of script ``name`` (``<name>.lua``), its libraries first; a missing file raises
    ``FileNotFoundError`` when the module that runs it is imported."""
    needs, code = _split(_file(name))
    return "".join(script(lib) for lib in needs) + code


def names() -> list[str]:
    """Every script and library this package holds, by name."""
    return sorted(p.name[: -len(".lua")] for p in resources.files(__name__).iterdir() if p.name.endswith(".lua"))
