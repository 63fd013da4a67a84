"""Tables printed whole (a helper of the commands, not a command: the leading underscore keeps it out of
`punchline --help`): one line per row, never cut or wrapped at the terminal's width.

A run id or a job id that rich folds at 80 columns cannot be copied; a row that spans lines cannot be
read by ``grep``. So a table is printed at its natural width (the terminal wraps a long line, the
text stays whole), and long free text (a job's failure message) is shortened before it is added.
The stage counters and batch tables that ``run``, ``status`` and ``batches`` print live here too, so the
read-only commands need not import the engine.
"""

from __future__ import annotations

import time
from collections.abc import Collection

from rich.box import HEAVY_HEAD, Box
from rich.console import Console
from rich.table import Table

from punchline.schedulers.batches import BatchRecord, not_ours_command
from punchline.schedulers.ledger import StageCounters


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


def counters_table(counters: dict[str, StageCounters], leased: dict[str, int] | None = None) -> Table:
    table = Table(
        "stage",
        "units",
        "done",
        "leased",
        "failed",
        "calls",
        "cached",
        "tokens in/out",
        "cost $",
        "rate/s",
        "ETA",
    )
    now = time.time()
    for stage, c in counters.items():
        elapsed = max((c.updated_at or now) - (c.started_at or now), 1e-9)
        rate = c.units_done / elapsed if c.units_done else 0.0
        left = c.units_total - c.units_done - c.units_failed
        eta = f"{left / rate:.0f}s" if rate and left > 0 else "-"
        table.add_row(
            stage,
            str(c.units_total),
            str(c.units_done),
            str((leased or {}).get(stage, "-")),
            str(c.units_failed),
            str(c.provider_requests),
            str(c.cache_hits),
            f"{c.input_tokens}/{c.output_tokens}",
            f"{c.cost_usd:.4f}",
            f"{rate:.1f}",
            eta,
        )
    return table


def duration(seconds: float) -> str:
    """An age as the batch tables and the progress line show it: ``2m05s``, ``1h02m``."""
    s = max(0, int(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _age(rec: BatchRecord) -> str:
    return duration((rec.collected_at or time.time()) - (rec.submitted_at or rec.intent_at))


def _look_alikes(r: BatchRecord) -> list[tuple[str, str]]:
    """The open look-alikes an intent waits on, oldest first, with their ages (none unless it waits)."""
    if r.state != "intent":
        return []
    now = time.time()
    return [(b, duration(now - created)) for b, created in sorted(r.look_alikes.items(), key=lambda kv: kv[1])]


def waiting_lines(records: list[BatchRecord], declared: Collection[str] = ()) -> list[str]:
    """What ``status`` and ``batches`` print under the table for each intent waiting on an open look-alike: the
    batch, its age, and on a line of its own (whole, to copy) the command that ends the wait; a look-alike
    ``declared`` not the run's already (``--not-ours``) is said to be so (the runner's next look drops it)."""
    lines = []
    for r in records:
        for batch_id, age in _look_alikes(r):
            if batch_id in declared:
                lines.append(
                    f"batch {r.batch_key[:12]} ({r.stage}) waited on {batch_id}, declared not this run's: the run "
                    "creates its own batch at its next look (a run that is not live: when it is resumed)"
                )
                continue
            lines.append(
                f"batch {r.batch_key[:12]} ({r.stage}) waits on {batch_id}, an open batch of its {r.requests} "
                f"requests, {age} old, created during its cut-off create call: nothing is created until its results "
                "tell whether it is this run's. Not this run's? Then:"
            )
            lines.append(f"  {not_ours_command(r.run_id, batch_id)}")
    return lines


def _note(r: BatchRecord) -> str:
    notes = [f"waits on {b} ({age} old): see below" for b, age in _look_alikes(r)]
    if r.error:
        notes.append(r.error)
    if r.fallback == "online":
        notes.append(f"{r.online_requests} requests went online (batch_fallback)")
    if r.cancelled_at:
        notes.append(f"cancelled {time.strftime('%H:%M:%S', time.gmtime(r.cancelled_at))} UTC")
    return "; ".join(notes)


def batch_table(records: list[BatchRecord]) -> Table:
    """One row per batch: what ``batches`` and ``status`` show (a note column only where there is a note)."""
    notes = [_note(r) for r in records]
    columns = ["batch", "stage", "provider/model", "state", "provider id", "requests", "ok", "failed", "age", "cost $"]
    table = Table(*columns, *(["note"] if any(notes) else []))
    table.columns[0].no_wrap, table.columns[0].min_width = True, 12  # the key a reader greps the log for
    for r, note in zip(records, notes, strict=True):
        state = r.state if not r.provider_status else f"{r.state} ({r.provider_status})"
        model = r.model.rsplit("/", 1)[-1]
        table.add_row(
            r.batch_key[:12],
            r.stage,
            f"{r.provider}/{model}" if model else r.provider,
            state,
            r.batch_id or "-",
            str(r.requests),
            str(r.succeeded),
            str(r.failed),
            _age(r),
            f"{r.cost_usd:.4f}",
            *([note] if any(notes) else []),
        )
    return table
