"""`punchline` sub-commands: humor (placeholder until its issue lands)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    del sub


def _unused(args: argparse.Namespace) -> int:
    return 0
