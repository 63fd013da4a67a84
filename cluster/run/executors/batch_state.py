"""What a :class:`~punchline.cluster.run.executors.batches.BatchRunner` knows while it runs a stage's batches, and the
records it hands back: its options, its totals, the errors that stop a stage, and the held parts of partly
answered requests.

It exists so the runner's concerns (pricing, submission, collection, the loop) can live in modules of their own
over one shared state: each of them is a class on top of :class:`BatchRunnerState`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
import structlog

from punchline.data.errors import ProviderError, PunchlineError
from punchline.data.provider_settings import ProviderSettings
from punchline.data.requests import ProviderResponse
from punchline.data.storage.response_cache import ResponseCache
from punchline.data.units import UnitSpec
from punchline.schedulers.batches import BatchRecord, BatchRecords, HeldLeases, now_s
from punchline.workers.batch_provider import BatchProvider, Part, merge_parts, parts
from punchline.workers.calls.validators import validator

log = structlog.get_logger("punchline.batches")  # one logger for the batches executor, whatever module logs


class BatchFailed(PunchlineError):
    """Requests no batch could answer (the provider refused their batch, or they failed ``max_rounds`` batches)
    that the config does not let go online (``batch_fallback = "fail"``): the stage stops, naming why."""


class BatchesCancelled(PunchlineError):
    """``punchline batches --cancel`` cancelled the run's batches while this runner was live: it sent nothing
    more, kept what came back, and stops the stage (a resume submits the rest)."""


class BatchOptions(msgspec.Struct, kw_only=True):
    lease_ms: int = 30_000  # a batch's hold on its units (the run's lease_ms); renewed every lease_ms / 4
    poll_min_s: float = 0.2
    poll_max_s: float = 60.0
    reconcile_window_s: float = 900.0  # how long after an intent an Anthropic batch may have been created
    clock_skew_s: float = 120.0  # how far the provider's clock may be behind ours (the listing goes back so far)
    # after a create whose outcome is unknown (a timeout), how long the listing must show nothing before the
    # batch is created again: a provider may finish creating it after the client gave up
    create_grace_s: float = 120.0
    max_rounds: int = 4  # batches a request may go through before it is given up (``batch_fallback`` says what then)
    # while an intent waits on a look-alike, how often the store's not-ours record is read between two looks (a
    # look lists the account, so looks back off to poll_max_s; ``--not-ours`` is seen within this instead)
    not_ours_poll_s: float = 2.0


class BatchTotals(msgspec.Struct, kw_only=True):
    """What a stage's batches did in this driver (answers cached, what they cost at the batch price). The
    run's figures come from the records (:func:`~punchline.schedulers.batches.with_batch_costs`), not these."""

    batches: int = 0
    requests_answered: int = 0  # requests (not parts) whose answer a batch of this driver cached
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    online_fallback: int = 0  # requests left to the online path (``batch_fallback = "online"``)


class BatchRunnerState:
    """The runner's state (what it was given, what it learned) and the parts bookkeeping every step uses."""

    def __init__(
        self,
        *,
        batches: BatchRecords,
        cache: ResponseCache,
        settings: dict[str, ProviderSettings],
        clients: dict[str, BatchProvider],
        stage: str,
        options: BatchOptions | None = None,
        sleep: Callable[[float], None] = time.sleep,
        max_cost_usd: float | None = None,
    ) -> None:
        self.batches = batches
        self.max_cost_usd = max_cost_usd  # the run's cap: a batch is priced and held in it before it is created
        self.cache = cache
        self.settings = settings
        self.clients = clients
        self.stage = stage
        self.opt = options or BatchOptions()
        self.sleep = sleep
        self.specs: dict[str, UnitSpec] = {}
        self.answered: set[str] = set()
        self.rounds: dict[str, int] = {}
        self.held: dict[str, dict[str, ProviderResponse]] = {}  # request key -> answered parts (its part file)
        self.totals = BatchTotals()
        self.started_at = now_s()
        self.cancelled_at = 0.0  # a cancel seen while live: nothing more is sent
        self.foreign: set[str] = set()  # batch ids proven not this run's (their results carry other ids)
        self.refused: list[BatchRecord] = []  # batches the provider refused whose requests may not go online
        self.exhausted: dict[str, str] = {}  # request key -> last reason, after max_rounds batches (may not go online)
        self.over_budget: list[BatchRecord] = []  # batches not created: they would have taken the run past its cap
        self.unsure: dict[str, float] = {}  # batch key -> when a create of unknown outcome failed (monotonic)
        self.waiting_since: dict[str, float] = {}  # batch key -> when its intent began to wait on a look-alike
        self.leases = HeldLeases(batches, self.opt.lease_ms)  # the batches' request leases, renewed meanwhile

    def _cached(self, key: str) -> bool:
        if key in self.answered:
            return True
        if self.cache.contains(key):
            self.answered.add(key)
            return True
        return False

    def _todo(self, key: str) -> list[Part]:
        """The parts of a request still to be asked for (all of them unless some are held)."""
        request = self.specs[key].request
        return parts(self.settings[request.provider], request, self.held.get(key, {}))

    def _load_held(self) -> None:
        """Read back the part files of this stage's requests (one listing): answered parts are never asked
        for again. A file whose request is cached meanwhile is stale and goes."""
        for key, file in self.batches.held_parts().items():
            unit = self.specs.get(key)
            if unit is None:  # another stage's request: that stage's runner reads it
                continue
            if key in self.answered:
                self.batches.drop_parts(key)
                continue
            ids = {p.custom_id for p in parts(self.settings[unit.request.provider], unit.request) if p.n == 1}
            held = {cid: r for cid, r in file.parts.items() if cid in ids}  # (settings may have changed since)
            if held:
                self.held[key] = held
            if not self._todo(key):  # whole but never cached (cannot happen in order; cheap to mend)
                self._complete(unit, held)

    def _complete(self, unit: UnitSpec, have: dict[str, ProviderResponse]) -> bool | None:
        """Cache the request's answer if ``have`` holds all its parts and it passes the unit's validator.
        None: parts are missing; False: the validator rejected it (the held parts go, the request is asked
        for whole again, as the online path retries all ``n``); True: cached, the part file is gone."""
        key = unit.request.key()
        outcome = merge_parts(unit.request, have, self.settings[unit.request.provider])
        if outcome.response is None:
            return None
        ok = True
        try:
            validator(unit.check)(outcome.response)
        except ProviderError:
            ok = False
        if ok:
            if not self.cache.put(unit.request, outcome.response):
                log.info("batch_answer_already_cached", key=key)
            self.answered.add(key)
        if self.held.pop(key, None) is not None:  # only after the cache put: a kill before it loses nothing
            self.batches.drop_parts(key)
        return ok
