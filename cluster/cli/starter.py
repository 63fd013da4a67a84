"""``punchline init``: a folder a new user can run from, with nothing but the installed package.

The wheel carries the example configs (``punchline/configs/``, the repository's ``configs/``) and the sample data
they read (``punchline/data/samples/``). Written side by side as ``DIR/configs/*.toml`` and
``DIR/data/samples/*``, the configs' relative paths (``../data/samples/...``) resolve exactly as in a checkout,
so the commands the README shows work unchanged from ``DIR``.
"""

from __future__ import annotations

import os
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import msgspec

from punchline.data.errors import InputError

#: the runnable examples, named as in the repository's ``configs/`` (each reads only the shipped samples)
CONFIGS = ("demo.toml", "prompts_demo.toml", "humor_demo.toml", "curate_demo.toml")
SAMPLES = ("puns_sample.json", "prompts_sample.jsonl", "humor_sample.json", "candidate_jokes.json")


class Starter(msgspec.Struct, frozen=True):
    """What ``init`` wrote (and kept, when a file was already there)."""

    folder: str
    written: list[str]
    kept: list[str]  # already present and left alone (``--force`` overwrites)
    next_command: str


def _shipped() -> list[tuple[Traversable, str]]:
    configs = resources.files("punchline") / "configs"
    samples = resources.files("punchline.data") / "samples"
    return [(configs / name, f"configs/{name}") for name in CONFIGS] + [
        (samples / name, f"data/samples/{name}") for name in SAMPLES
    ]


def write_starter(folder: str | os.PathLike[str], *, force: bool = False) -> Starter:
    """Write the example configs and their sample data into ``folder`` (created if missing)."""
    root = Path(folder)
    if root.exists() and not root.is_dir():
        raise InputError("is a file, not a folder", file=str(root))
    files = _shipped()
    missing = [rel for source, rel in files if not source.is_file()]
    if missing:  # a broken install, not a user mistake: still one line
        raise InputError(f"this installation lacks {', '.join(missing)}; reinstall punchline", file=str(root))
    written: list[str] = []
    kept: list[str] = []
    for source, rel in files:
        target = root / rel
        if target.exists() and not force:
            kept.append(rel)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        written.append(rel)
    where = "" if root.resolve() == Path.cwd().resolve() else f"cd {root} && "
    return Starter(folder=str(root), written=written, kept=kept, next_command=f"{where}punchline run configs/demo.toml")
