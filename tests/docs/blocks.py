"""The fenced code blocks of a Markdown page, and the convention that says which of them the suite runs.

* ```` ```python ````: run as-is, by the venv's ``python`` in the page's scratch folder (each block a process);
* ```` ```console ````: each line starting with ``$ `` is a command run by bash there (a line ending in ``\\``
  continues on the next), which must exit 0 (as typed: ``cmd | grep x`` is grep's status, so a page may show an
  expected error that way); the other lines are output, shown, not checked;
* ```` ```toml ```` whose first line is ``# file: NAME``: written to NAME before the page's first command;
* anything else is shown, never run (```` ```text ```` for output, fragments and cluster-only commands), except
  that a block with no language or a shell's (``sh``, ``bash``...) is refused: say ``console`` or ``text``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

#: languages that leave open whether the block runs: the page must say console (it runs) or text (it does not)
AMBIGUOUS = frozenset({"", "sh", "bash", "shell", "zsh", "shell-session", "py", "python3", "pycon"})

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_FILE = re.compile(r"^#\s*file:\s*(?P<name>\S+)\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # the page's path from the repository's root
    line: int  # the line of its opening fence (1-based)
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line} ({self.lang or 'no language'} block)"

    @property
    def file_name(self) -> str | None:
        """NAME of a ``toml`` block whose first line is ``# file: NAME``."""
        first = self.text.split("\n", 1)[0]
        match = _FILE.match(first) if self.lang == "toml" else None
        return match["name"] if match else None

    def commands(self) -> list[tuple[int, str]]:
        """A console block's commands: (line in the page, command), continuation lines joined."""
        out: list[tuple[int, str]] = []
        lines = self.text.split("\n")
        i = 0
        while i < len(lines):
            if lines[i].startswith("$ "):
                at, command = self.line + 1 + i, lines[i][2:]
                while command.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    command = command[:-1] + " " + lines[i].strip()
                out.append((at, command))
            i += 1
        return out

    @property
    def runs(self) -> bool:
        return self.lang in ("python", "console")


def blocks(path: Path) -> list[Block]:
    """Every fenced block of the page, its indentation (a block in a list item) removed."""
    page = str(path.relative_to(REPO))
    out: list[Block] = []
    lines = path.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        info = match["info"].strip()
        lang = info.split()[0].strip("{}.").lower() if info else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not re.match(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        out.append(Block(page, i + 1, lang, "\n".join(body)))
        i = j + 1
    return out


def pages() -> list[Path]:
    """The README and every page of the site."""
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
