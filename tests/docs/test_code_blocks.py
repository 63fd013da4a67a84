"""Every code block of the documentation that says it runs does run (tests/docs/blocks.py has the convention).

Each page runs in a scratch folder of its own, as a new user would type it: HOME empty, nothing configured,
``punchline init .`` run first (so ``configs/*.toml`` and ``data/samples/`` are there), the page's
``# file:`` TOML blocks written, then its python and console blocks in order; every one must succeed. A failure
names the page and the line of the block (or of the command).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import AMBIGUOUS, REPO, Block, blocks, pages

VENV_BIN = Path(sys.executable).parent
TIMEOUT_S = 300  # a guard against a hang, not a timing: a page's blocks take seconds


def _runnable_pages() -> list[Path]:
    return [p for p in pages() if any(b.runs for b in blocks(p))]


def test_every_block_says_whether_it_runs() -> None:
    unclear = [
        f"{b.where}: say ```console (its `$ ` lines run) or ```text (shown only)"
        for p in pages()
        for b in blocks(p)
        if b.lang in AMBIGUOUS
    ]
    unclear += [
        f"{b.where}: a console block runs only its `$ ` lines and this one has none: make it ```text"
        for p in pages()
        for b in blocks(p)
        if b.lang == "console" and not b.commands()
    ]
    assert not unclear, "\n".join(unclear)


def test_the_readme_and_the_getting_started_page_run_something() -> None:
    """The convention is in force where a newcomer reads first (a page of only text blocks would pass anything)."""
    runnable = {str(p.relative_to(REPO)) for p in _runnable_pages()}
    assert {"README.md", "docs/getting-started.md"} <= runnable


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUNCHLINE_", "RAY_", "XDG_", "AWS_"))}
    env.update(
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        PATH=f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
        PUNCHLINE_LOCAL_RAY_LINGER_S="5",  # a local Ray head a page started goes soon after the page's last run
        NO_MKDOCS_2_WARNING="1",
        PYTHONFAULTHANDLER="1",  # a block that aborts (a native library's SIGABRT) shows its threads' stacks
    )
    env.pop("VIRTUAL_ENV", None)
    return env


def _check(result: subprocess.CompletedProcess[str], where: str, what: str) -> None:
    if result.returncode != 0:
        pytest.fail(
            f"{where}: {what} exited {result.returncode}\n--- stdout (end)\n{result.stdout[-3000:]}"
            f"\n--- stderr (end)\n{result.stderr[-3000:]}",
            pytrace=False,
        )


def _run_block(block: Block, scratch: Path, env: dict[str, str]) -> None:
    if block.lang == "python":
        # from stdin, so the scratch folder (the working directory) is on sys.path as for `python` typed there
        result = subprocess.run(
            [str(VENV_BIN / "python"), "-"],
            input=block.text,
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        _check(result, block.where, "the block")
        return
    for line, command in block.commands():
        result = subprocess.run(
            ["bash", "-c", command],  # as typed: `cmd | grep x` is grep's status,
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        _check(result, f"{block.page}:{line}", f"`{command}`")


@pytest.mark.slow
@pytest.mark.parametrize("page", _runnable_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_the_page_s_code_blocks_run(page: Path, tmp_path: Path) -> None:
    scratch, home = tmp_path / "scratch", tmp_path / "home"
    scratch.mkdir()
    home.mkdir()
    env = _env(home)
    init = subprocess.run(
        ["punchline", "init", "."], cwd=scratch, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    _check(init, str(page.relative_to(REPO)), "`punchline init .`")
    found = blocks(page)
    for block in found:
        if (name := block.file_name) is not None:
            target = scratch / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text + "\n", encoding="utf-8")
    for block in found:
        if block.runs:
            _run_block(block, scratch, env)
