"""The progress display of a run: a line saying what the run is doing now, and one bar per stage.

The bars are fed from the ledger's counters (the coordinator's progress callback). The line above them comes
from the events this process logs (:func:`punchline.workers.logs.add_listener`): planning a stage, starting
or joining Ray, reducing, each poll of a provider batch, ... with the seconds since that phase began, so a
phase of many seconds shows as such instead of a frozen bar (issue 31: no silent gaps).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from punchline.cluster.cli.commands._tables import duration
from punchline.schedulers.ledger import StageCounters
from punchline.workers.logs import add_listener

Event = Mapping[str, object]  # a logged event's fields (already redacted)
# what the line says: a text, or a text of the seconds the phase has lasted (an age that grows while it is shown)
PhaseText = str | Callable[[float], str]


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _stage(e: Event) -> str:
    return f"{e['stage']}: " if e.get("stage") else ""


def _batch(e: Event) -> str:
    done = _int(e.get("succeeded")) + _int(e.get("failed"))
    return f"{_stage(e)}waiting on batch {e.get('batch_id', '')} ({e.get('status', '')}, {done}/{e.get('total', '?')})"


def _seconds(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def _look_alike(e: Event) -> Callable[[float], str]:
    """An intent waiting on an open look-alike batch (the runner's ``batch_unresolved``): which batch, how old
    (growing while it is shown) and the command that ends the wait."""
    stage, batch_id, release, age_s = _stage(e), e.get("batch_id", ""), e.get("release", ""), _seconds(e.get("age_s"))
    return lambda lasted_s: (
        f"{stage}waiting on batch {batch_id} (open, {duration(age_s + lasted_s)} old): it may be this run's own "
        f"(its create call was cut off) until its results tell; not this run's? {release}"
    )


#: why an intent no longer waits on a look-alike, by the runner's ``batch_wait_over`` outcome
_WAIT_OUTCOMES = {"adopted": "it was this run's: adopted", "absent": "none was this run's: creating its own"}


def _wait_over(e: Event) -> str:
    declared = e.get("declared_not_ours")
    named = ", ".join(str(b) for b in declared) if isinstance(declared, list) else ""
    why = f"{named} declared not this run's" if named else _WAIT_OUTCOMES.get(str(e.get("outcome")), "")
    key = str(e.get("batch_key", ""))[:12]
    return f"{_stage(e)}batch {key} no longer waits on a look-alike ({why}, after {_seconds(e.get('waited_s')):.0f} s)"


#: what a logged event says the run is doing from then on (an event not named here changes nothing shown)
PHASES: dict[str, Callable[[Event], PhaseText]] = {
    "run_start": lambda e: "starting the stages",
    "ledger_joined": lambda e: "joined the shared ledger",
    "plan_start": lambda e: f"{_stage(e)}planning (cutting its units into shards)",
    "plan_done": lambda e: f"{_stage(e)}planned {e.get('units', '?')} units: working (waiting for the first shard)",
    "fork_warmup_settling": lambda e: f"{_stage(e)}starting its worker once the SDK and plot imports it inherits end",
    "local_worker_starting": lambda e: f"{_stage(e)}starting the driver's own worker process",
    "stage_skipped": lambda e: f"{_stage(e)}already done: skipped",
    "reduce_start": lambda e: f"{_stage(e)}reducing {e.get('units', '?')} units (reports, plots)",
    "reduce_done": lambda e: f"{_stage(e)}reduced in {e.get('seconds', '?')} s",
    "batch_intent": lambda e: f"{_stage(e)}submitting a batch of {e.get('requests', '?')} requests",
    "batch_submitted": lambda e: f"{_stage(e)}batch {e.get('batch_id', '')} submitted",
    "batch_poll": _batch,
    "batch_collected": lambda e: f"collected batch {e.get('batch_id', '')} ({e.get('succeeded', '?')} answered)",
    "batch_unresolved": _look_alike,
    "batch_wait_over": _wait_over,
    "worker_died": lambda e: "a worker died: starting another",
    "ledger_unavailable": lambda e: "the ledger is out of reach: waiting for it (nothing is paid meanwhile)",
    "run_end": lambda e: f"run ended: {e.get('state', '')}",
}
#: what happens beside the stages (Ray starting while the driver's own worker works): shown after the phase
ASIDES: dict[str, Callable[[Event], str | None]] = {
    "local_ray_starting": lambda e: "the local Ray head is starting (its workers join once it is up)",
    "local_ray_joined": lambda e: None,
}
RAY_UP = "ray_up"  # a start_phases event with this mark: Ray is joined (the aside above is over)


def _never_parsed(e: Event) -> str:
    return (
        f"{_stage(e)}0 of {e.get('answers', '?')} answers parsed ({e.get('how', '')}): "
        "its parse does not read what the model writes (or the prompt does not ask for it)"
    )


#: what is wrong with a run's results though the run goes on: kept under the phase line, said on stderr without the
#: display, and again in the run's summary (:class:`Warnings`)
WARNINGS: dict[str, Callable[[Event], str]] = {"answers_never_parsed": _never_parsed}


def _warning(say: Callable[[Event], str], e: Event) -> str:
    return f"warning: {say(e)}"


#: what a run shown without the display (``--no-progress``) still says, a line each on stderr: a wait that only
#: the run's user can end, and its end
NOTICES: dict[str, Callable[[Event], str]] = {
    "batch_unresolved": lambda e: _look_alike(e)(0.0),
    "batch_wait_over": _wait_over,
    **{name: functools.partial(_warning, say) for name, say in WARNINGS.items()},
}


class _Listening:
    """What listens to this process's log events while it is shown: ``start`` adds :meth:`on_event`, ``stop`` removes
    it (twice is harmless). The bars' phase line, its warnings and the plain notices are each one."""

    _unlisten: Callable[[], None] | None = None

    def on_event(self, event: Event) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._unlisten = add_listener(self.on_event)

    def stop(self) -> None:
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None


class Phase(_Listening):
    """What the run is doing now and since when; renders as one line with the seconds it has lasted."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._text: PhaseText = "starting"
        self.since = clock()
        self.aside: str | None = None
        self.warnings = Warnings()  # kept under the line until the run ends
        self._lock = threading.Lock()

    def on_event(self, event: Event) -> None:
        self.warnings.on_event(event)
        name = str(event.get("event", ""))
        aside = ASIDES.get(name)
        if aside is not None or (name == "start_phases" and RAY_UP in event):
            with self._lock:
                self.aside = aside(event) if aside is not None else None
        describe = PHASES.get(name)
        if describe is None:
            return
        try:
            text = describe(event)
        except (TypeError, ValueError):  # a field of an unexpected type: the event's name says enough
            text = name
        self.set(text)

    @property
    def text(self) -> str:
        """What the run is doing now, as the line says it."""
        with self._lock:
            return self._render(self.clock() - self.since)

    def _render(self, lasted_s: float) -> str:
        return self._text(lasted_s) if callable(self._text) else self._text

    def progressed(self, stage: str) -> None:
        """A stage's units are being answered: it is working, unless the line already says something more
        particular about it (reducing, waiting on a batch)."""
        text = self.text
        if not text.startswith(f"{stage}: ") or text.startswith((f"{stage}: planned", f"{stage}: starting")):
            self.set(f"{stage}: working")

    def set(self, text: PhaseText) -> None:
        with self._lock:
            if text != self._text:
                self._text, self.since = text, self.clock()

    def line(self) -> str:
        with self._lock:
            lasted = self.clock() - self.since
            line = f"now: {self._render(lasted)}" + (f" ({lasted:.0f} s)" if lasted >= 1 else "")
            return line + (f"; {self.aside}" if self.aside else "")

    def __rich__(self) -> Text:
        text = Text(self.line(), style="cyan")
        for warning in self.warnings.lines:
            text.append(f"\nwarning: {warning}", style="yellow")
        return text


class Warnings(_Listening):
    """The :data:`WARNINGS` a run logged, in order, each once: what the run's summary says again at its end."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def on_event(self, event: Event) -> None:
        describe = WARNINGS.get(str(event.get("event", "")))
        if describe is None:
            return
        try:
            line = describe(event)
        except (TypeError, ValueError):  # a field of an unexpected type: the event's name says enough
            line = str(event.get("event"))
        if line not in self.lines:
            self.lines.append(line)


class Bars:
    """One progress bar per stage, fed from the ledger's counters, under the phase line."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[extra]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self.tasks: dict[str, TaskID] = {}
        self.phase = Phase()
        self.live = Live(Group(self.phase, self.progress), console=console, refresh_per_second=4)

    def start(self) -> None:
        self.phase.start()
        self.live.start()

    def stop(self) -> None:
        self.phase.stop()
        self.live.stop()

    def __call__(self, stage: str, c: StageCounters) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(stage, total=c.units_total, extra="")
        extra = f"calls {c.provider_requests} cached {c.cache_hits} failed {c.units_failed} ${c.cost_usd:.4f}"
        self.progress.update(
            self.tasks[stage], completed=c.units_done + c.units_failed, total=c.units_total, extra=extra
        )
        if 0 < c.units_done + c.units_failed < c.units_total:
            self.phase.progressed(stage)


class Notices(_Listening):
    """The events of :data:`NOTICES` as plain lines on stderr, for a run shown without bars (``--no-progress``):
    a CI log then says what the run waits on and how to end the wait, as the bars' line would."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def on_event(self, event: Event) -> None:
        describe = NOTICES.get(str(event.get("event", "")))
        if describe is not None:
            self.console.print(f"punchline: {describe(event)}", markup=False, highlight=False, soft_wrap=True)
