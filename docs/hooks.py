"""MkDocs hooks (mkdocs.yml ``hooks:``): the two reference pages that are generated from the code at build time.

* ``settings.md``: what ``punchline settings`` prints (``punchline.cluster.cli.settings_doc.reference``), so the
  site's table is the code's even when the committed ``docs/settings.md`` (the copy GitHub shows, which
  ``tests/data/test_settings.py`` keeps in step) was not regenerated yet.
* ``cli.md``: every command's ``--help``, from the parser ``punchline`` itself builds
  (``punchline.cluster.cli.main.build_parser``), sub-commands of a family (``punchline puns rank``) included.
  Help text goes in ``text`` blocks: shown, never run by the docs' code-block tests.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

HELP_COLUMNS = "100"  # argparse wraps help to the terminal's width: a fixed one, so the page is the same everywhere

CLI_HEADER = """# CLI reference

Every `punchline` command and its options, generated from the command's own parser when the site is built
(`punchline COMMAND --help` prints the same). A flag wins over its environment variable, which wins over the
config's key: the [settings reference](settings.md) lists them all.
"""


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each sub-command of ``parser``, in the order ``--help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _command_sections(parser: argparse.ArgumentParser, depth: int) -> Iterator[str]:
    for _name, line, sub in _subcommands(parser):
        yield f"{'#' * depth} `{sub.prog}`\n"
        if line:
            yield f"{line[0].upper()}{line[1:]}.\n"
        yield f"```text\n{sub.format_help().rstrip()}\n```\n"
        yield from _command_sections(sub, depth + 1)


def cli_reference() -> str:
    """The CLI page's markdown: ``punchline --help``, then a section per command (and per family member)."""
    from punchline.cluster.cli.main import build_parser

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        parser = build_parser()
        parts = [CLI_HEADER, f"```text\n{parser.format_help().rstrip()}\n```\n", *_command_sections(parser, 2)]
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before
    return "\n".join(parts)


def settings_reference() -> str:
    from punchline.cluster.cli.settings_doc import reference

    return reference()


GENERATED = {"settings.md": settings_reference, "cli.md": cli_reference}


def on_files(files: Files, config: MkDocsConfig, **kwargs: Any) -> Files:
    """Put the generated pages in place of (or beside) whatever ``docs/`` holds under their names."""
    for name, make in GENERATED.items():
        old = files.get_file_from_path(name)
        if old is not None:
            files.remove(old)
        files.append(File.generated(config, name, content=make()))
    return files
