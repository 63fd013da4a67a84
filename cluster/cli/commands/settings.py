"""``punchline settings``: the settings reference (every TOML key and environment variable), from the code.

``punchline settings > docs/settings.md`` regenerates the docs' reference table; the test suite fails when
the file and the code disagree, so a new key or variable cannot ship undocumented.
"""

from __future__ import annotations

import argparse
import sys

from punchline.cluster.cli.commands import summary
from punchline.cluster.cli.settings_doc import reference
from punchline.cluster.cli.shared import Subcommands


def register(sub: Subcommands) -> None:
    p = sub.add_parser(
        "settings",
        help=summary("settings"),
        description="Print the settings reference (docs/settings.md) generated from the code: every TOML table "
        "and key of a run config and every PUNCHLINE_* environment variable.",
    )
    p.set_defaults(func=cmd_settings)


def cmd_settings(args: argparse.Namespace) -> int:
    sys.stdout.write(reference())
    return 0
