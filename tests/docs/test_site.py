"""The documentation site builds with ``mkdocs build --strict``: a broken link or anchor between pages, a page left
out of the nav, a docstring mkdocstrings cannot render, each fails it (mkdocs.yml's ``validation``). The README is
read on GitHub and PyPI, outside the site: its relative links are checked here against the checkout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from punchline.cluster.cli.commands import index
from tests.docs.blocks import REPO, blocks

MKDOCS = Path(sys.executable).parent / "mkdocs"
_LINK = re.compile(r"(?<!\\)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN = re.compile(r"`[^`\n]*`")


def _slug(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) gives a heading: lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[\s]+", "-", text).strip("-")


def _anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    for block in blocks(page):  # a '# comment' in a code block is no heading
        text = text.replace(block.text, "")
    return {_slug(m[1]) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def _prose(path: Path) -> str:
    """The page without its code blocks and code spans (a link shown as code is not a link)."""
    text = path.read_text(encoding="utf-8")
    for block in blocks(path):
        text = text.replace(block.text, "")
    return _CODE_SPAN.sub("", text)


def test_every_relative_link_of_the_readme_resolves() -> None:
    readme = REPO / "README.md"
    broken = []
    links = list(_LINK.finditer(_prose(readme)))
    for match in links:
        target = match["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check offline
            continue
        path, _, anchor = target.partition("#")
        resolved = (readme.parent / path).resolve() if path else readme
        if not resolved.exists():
            broken.append(f"README.md: ({target}): no such file {resolved.relative_to(REPO)}")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"README.md: ({target}): {path or 'README.md'} has no heading #{anchor}")
    assert len(links) >= 10, "the README links into the site"
    assert not broken, "\n".join(broken)


@pytest.mark.slow
def test_the_site_builds_with_every_link_and_anchor_checked(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path / "home"), "NO_MKDOCS_2_WARNING": "1"}
    site = tmp_path / "site"
    built = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    warnings = [line for line in built.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert built.returncode == 0, "\n".join(warnings) or built.stderr[-3000:]
    # the generated references are there, from the code: every command of the index, every settings table
    cli = (site / "cli" / "index.html").read_text()
    missing = [name for name in index() if f"punchline {name}" not in cli]
    assert not missing, f"the CLI reference lacks {missing}"
    assert "punchline puns rank" in cli, "a family's sub-commands are there too"
    settings = (site / "settings" / "index.html").read_text()
    assert "PUNCHLINE_RUNS_DIR" in settings and "max_concurrency" in settings
    api = (site / "api" / "index.html").read_text()
    assert "run_simulated" in api and "artifact_url" in api, "mkdocstrings rendered the API"
