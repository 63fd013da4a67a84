"""Tables printed whole (a helper of the commands, not a command: the leading underscore keeps it out of
`punchline --help`): one line per row, never cut or wrapped at the terminal's width.

A run id or a job id that rich folds at 80 columns cannot be copied; a row that spans lines cannot be
read by ``grep``. So a table is printed at its natural width (the terminal wraps a long line, the
text stays whole), and long free text (a job's failure message) is shortened before it is added.
"""

from __future__ import annotations

from rich.box import HEAVY_HEAD, Box
from rich.console import Console
from rich.table import Table


def whole_table(*headers: str, box: Box | None = HEAVY_HEAD) -> Table:
    """A table whose cells never wrap (each row is one line); ``box=None``: no lines between cells."""
    table = Table(box=box)
    for header in headers:
        table.add_column(header, no_wrap=True)
    return table


def print_whole(table: Table, *, stderr: bool = False) -> None:
    """Print ``table`` at its natural width, however narrow the terminal or pipe."""
    console = Console(stderr=stderr)
    needed = console.measure(table, options=console.options.update_width(100_000)).maximum
    Console(stderr=stderr, width=max(console.width, needed)).print(table)
