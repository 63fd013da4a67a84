"""The progress display's phase line: what the run logs becomes what the display says it is doing, with how long."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from rich.console import Console

from punchline.cluster.cli.commands._progress import Bars, Notices, Phase, Warnings
from punchline.schedulers.ledger import StageCounters
from punchline.workers.logs import add_listener, configure_logging, reset_logging


@pytest.fixture
def logging_to(tmp_path: Path) -> Iterator[Path]:
    path = configure_logging(tmp_path, console=False)
    assert path is not None
    try:
        yield path
    finally:
        reset_logging()


def test_the_phase_line_follows_the_log(logging_to: Path) -> None:
    now = [100.0]
    console = Console(record=True, width=120, force_terminal=False)
    bars = Bars(console)
    bars.phase = phase = Phase(clock=lambda: now[0])  # a clock the test moves
    log = structlog.get_logger("punchline.coordinator")
    unlisten = add_listener(phase.on_event)
    try:
        log.info("plan_start", run_id="r", stage="generate")
        assert phase.line() == "now: generate: planning (cutting its units into shards)"
        now[0] += 17
        assert phase.line().endswith("(17 s)")  # a long phase says how long it has lasted
        log.info("shard_done", shard=3)  # not a phase: nothing changes
        assert "planning" in phase.line()
        log.info("plan_done", run_id="r", stage="generate", units=600)
        log.info("local_worker_starting", stage="generate", how="fork")  # a second or two: said
        assert phase.line() == "now: generate: starting the driver's own worker process"
        bars("generate", StageCounters(units_total=600, units_done=20))
        assert phase.line() == "now: generate: working"
        log.info("batch_poll", stage="judge", batch_id="msgbatch_01", status="in_progress", total=10, succeeded=3)
        assert phase.line() == "now: judge: waiting on batch msgbatch_01 (in_progress, 3/10)"
        log.info("reduce_start", run_id="r", stage="judge", units=10)
        console.print(phase, bars.progress)
        text = console.export_text()
        assert "now: judge: reducing 10 units" in text and "20/600" in text
    finally:
        unlisten()
    log.info("plan_start", run_id="r", stage="later")  # removed: the display no longer follows
    assert "judge: reducing" in phase.line()
    assert '"event": "plan_start"' in logging_to.read_text()  # the log itself is written as before


def test_bars_start_and_stop_follow_the_log_only_while_shown(logging_to: Path) -> None:
    bars = Bars(Console(record=True, width=120, force_terminal=False))
    bars.start()
    log = structlog.get_logger()
    log.info("plan_done", stage="s", units=9)
    log.info("local_ray_starting", address="127.0.0.1:1", pid=1)  # beside the stage, not instead of it
    bars("s", StageCounters(units_total=9, units_done=2))
    assert bars.phase.line() == "now: s: working; the local Ray head is starting (its workers join once it is up)"
    log.info("start_phases", driver_start=1.0, ray_up=2.0)
    assert bars.phase.line() == "now: s: working"
    bars.stop()
    log.info("reduce_start", stage="s", units=1)
    assert bars.phase.line() == "now: s: working"


def test_a_wait_on_a_look_alike_is_said_with_its_growing_age_and_the_command_that_ends_it(logging_to: Path) -> None:
    """Issue 39 item 5: the line names the batch an intent waits on, its age (which grows while the line is shown)
    and the command that ends the wait; without the bars (``--no-progress``) the same is one line on stderr, and
    so is the wait's end."""
    from punchline.cluster.cli.commands._progress import Notices

    now = [100.0]
    phase = Phase(clock=lambda: now[0])
    err = Console(record=True, width=400, force_terminal=False)
    notices = Notices(err)
    notices.start()
    unlisten = add_listener(phase.on_event)
    log = structlog.get_logger("punchline.batches")
    release = "punchline batches r1 --not-ours msgbatch_other"
    try:
        log.warning(
            "batch_unresolved", stage="judge", batch_key="a" * 32, batch_id="msgbatch_other", age_s=151, release=release
        )
        line = phase.line()
        assert line.startswith("now: judge: waiting on batch msgbatch_other (open, 2m31s old)") and release in line
        now[0] += 60
        assert "(open, 3m31s old)" in phase.line() and phase.line().endswith(f"{release} (60 s)")
        log.info(
            "batch_wait_over", stage="judge", batch_key="a" * 32, declared_not_ours=["msgbatch_other"], waited_s=61.2
        )
        assert phase.line() == (
            "now: judge: batch aaaaaaaaaaaa no longer waits on a look-alike (msgbatch_other declared not this run's, "
            "after 61 s)"
        )
    finally:
        unlisten()
        notices.stop()
    log.warning("batch_unresolved", stage="judge", batch_id="msgbatch_later", age_s=1, release=release)
    said = err.export_text().splitlines()
    assert len(said) == 2, said  # the wait and its end, one line each; nothing after the notices stopped
    assert (
        said[0].startswith("punchline: judge: waiting on batch msgbatch_other (open, 2m31s old)") and release in said[0]
    )
    assert said[1].startswith("punchline: judge: batch aaaaaaaaaaaa no longer waits")


def test_a_stage_whose_answers_never_parse_is_a_warning_under_the_line_and_in_the_summary(logging_to: Path) -> None:
    console = Console(record=True, width=200, force_terminal=False)
    phase, notices, summary = Phase(), Notices(console), Warnings()
    log = structlog.get_logger("punchline.stages")
    unlisten = add_listener(phase.on_event)
    notices.start()
    summary.start()
    try:
        log.warning("answers_never_parsed", run_id="r", stage="answer", answers=240, how="regex (?P<a>[ABCD])")
        log.info("reduce_done", run_id="r", stage="answer", seconds=0.1)  # the phase moves on; the warning stays
        log.warning("answers_never_parsed", run_id="r", stage="answer", answers=240, how="regex (?P<a>[ABCD])")
    finally:
        unlisten()
        notices.stop()
        summary.stop()
    said = "answer: 0 of 240 answers parsed (regex (?P<a>[ABCD]))"
    assert len(summary.lines) == 1 and summary.lines[0].startswith(said)  # once, for the end-of-run summary
    console.print(phase)
    shown = console.export_text()
    assert "now: answer: reduced in 0.1 s" in shown and f"warning: {said}" in shown  # markup-free: [ABCD] kept
    assert shown.count(f"punchline: warning: {said}") == 2  # --no-progress: a line on stderr as it happens
