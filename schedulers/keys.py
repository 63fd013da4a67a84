"""Every Redis key the engine reads or writes, spelled here and nowhere else.

Why one module: a key is an interface between processes (a worker writes what the driver, ``status`` or
another run reads), so two spellings of one key are a bug waiting for a typo; and a reader who wants to
know what the ledger holds finds it all on one page. Each family below says what its key holds, its
Redis type and who writes it. ``tests/schedulers/test_keys.py`` fails on a key-shaped string literal
anywhere else in the engine.

Every key starts with a namespace (:data:`NAMESPACE` unless a caller passes its own), so two engines can
share a Redis. This module is the ground floor for keys: it imports the standard library only.

**Hash tags: every script's keys in one slot.** A Redis Cluster runs a script only when all its keys hash to one
slot, and the slot of a key with ``{...}`` in it is the slot of what the braces hold. So each family carries the
tag of what its scripts touch together: a run's keys (its stages' queues, its fence, budget, usage and call
figures) ``{run:<id>}``; a provider's rate cells and in-flight bounds ``{<provider>}``; a request lease
``{<first character of its hash>}`` (:data:`REQUEST_GROUPS` groups, so a take or renewal of many requests is one
script call per group on a cluster). On a single Redis the braces change nothing but the names. What a rename
costs is in ``docs/architecture.md`` (*A ledger on a Redis Cluster*): the ledger is a cache of leases.
"""

from __future__ import annotations

from dataclasses import dataclass

# The namespace every key starts with by default (``PUNCHLINE_RATE_NAMESPACE`` defaults to the same).
NAMESPACE = "pl"


# how many characters of a request's hash make its slot group: one hex digit, 16 groups
REQUEST_TAG_CHARS = 1
REQUEST_GROUPS = 16


def request_group(key: str) -> str:
    """The slot group of a request (by its content hash): the requests of one group share a hash tag."""
    return key[:REQUEST_TAG_CHARS]


def request(namespace: str, key: str) -> str:
    """The lease of one provider request, global (shared by every run using this ledger); ``key`` is the
    request's content hash. A string: ``owner|token`` while held, ``=<pack>`` for a short while after its
    answer was committed (the done marker). Written by the lease scripts (``schedulers/leases.py``, and
    ``schedulers/batches.py`` for the requests a provider batch holds)."""
    return f"{namespace}:req:{{{request_group(key)}}}:{key}"


def fence(namespace: str, group: str | None = None) -> str:
    """A counter that hands out fencing tokens, so a token is never reused for a key, even after its lease is
    gone. A string (``INCR``). Without ``group``: the one counter of every request lease on a single Redis; with
    one: that request group's own (on a cluster, where a script may touch one slot only: a lease's token is only
    ever compared with its own key's, so one counter per group never reuses a token for a key). A run's shard
    leases take theirs from the run's fence (:attr:`StageKeys.fence`)."""
    return f"{namespace}:fence" if group is None else f"{namespace}:req:{{{group}}}:fence"


def run_base(namespace: str, run_id: str) -> str:
    """What every key of one run starts with: its hash tag ``{run:<id>}`` puts them all in one slot."""
    return f"{namespace}:{{run:{run_id}}}"


@dataclass(frozen=True)
class StageKeys:
    """The keys of one stage of one run, written by the coordinator's :class:`~punchline.schedulers.ledger.Ledger`
    (queue rebuilds) and the workers' :class:`~punchline.schedulers.leases.Leases` (claims, commits)."""

    namespace: str
    run_id: str
    stage: str

    @property
    def base(self) -> str:
        return f"{run_base(self.namespace, self.run_id)}:stage:{self.stage}"

    @property
    def fence(self) -> str:
        """String (``INCR``): the run's fence, the tokens of its shard leases (in the run's slot, as the claim
        script needs)."""
        return f"{run_base(self.namespace, self.run_id)}:fence"

    @property
    def todo(self) -> str:
        """Sorted set: the shards nobody has claimed, scored by shard number (deferred ones far above)."""
        return f"{self.base}:todo"

    @property
    def leased(self) -> str:
        """Sorted set: the claimed shards, scored by their lease deadline (ms)."""
        return f"{self.base}:leased"

    @property
    def holders(self) -> str:
        """Hash: a leased shard -> ``owner|token``."""
        return f"{self.base}:holders"

    @property
    def meta(self) -> str:
        """Hash: the stage's ``shards_total`` and ``units_total``, written when its queue is (re)built; a claim
        on a stage without it answers "unknown" (Redis was wiped: the coordinator rebuilds the queue)."""
        return f"{self.base}:meta"

    @property
    def counters(self) -> str:
        """Hash: the stage's progress counters (:class:`~punchline.schedulers.ledger.StageCounters`)."""
        return f"{self.base}:counters"

    @property
    def failed(self) -> str:
        """Hash: a failed unit -> why, for ``status``."""
        return f"{self.base}:failed"


@dataclass(frozen=True)
class BudgetKeys:
    """The keys of one run's cost budget, written by :mod:`punchline.schedulers.budget`'s scripts (also run
    inside the lease scripts) and, for ``usage``, by the shard commit."""

    namespace: str
    run_id: str

    @property
    def base(self) -> str:
        return f"{run_base(self.namespace, self.run_id)}:budget"

    @property
    def spent(self) -> str:
        """String (a float, ``INCRBYFLOAT``): dollars settled so far."""
        return f"{self.base}:spent"

    @property
    def reserved(self) -> str:
        """Hash: holder -> dollars it holds reserved."""
        return f"{self.base}:reserved"

    @property
    def alive(self) -> str:
        """Sorted set: holder -> when its reservation expires (ms)."""
        return f"{self.base}:alive"

    @property
    def usage(self) -> str:
        """Hash: ``stage\\x1fmodel\\x1f(in|out|usd)`` -> tokens or dollars (reporting only)."""
        return f"{self.base}:usage"

    @property
    def scripted(self) -> list[str]:
        """spent, reserved, alive: the keys every budget script takes, in this order."""
        return [self.spent, self.reserved, self.alive]


@dataclass(frozen=True)
class RateKeys:
    """The rate limiter's cells of one provider (and one of its models), written by the GCRA scripts of
    :mod:`punchline.schedulers.rate_limit` (also run inside the lease scripts)."""

    namespace: str
    provider: str
    model: str = ""

    @property
    def base(self) -> str:
        return f"{self.namespace}:rl:{{{self.provider}}}"

    @property
    def requests(self) -> str:
        """String (a float): the provider's request cell, its theoretical arrival time (ms)."""
        return f"{self.base}:req"

    @property
    def tokens(self) -> str:
        """String (a float): the provider's token cell."""
        return f"{self.base}:tok"

    @property
    def state(self) -> str:
        """Hash: the provider's rate factor ``f``, its cap ``cap`` and when it last changed (``c``, ``d``)."""
        return f"{self.base}:state"

    @property
    def model_requests(self) -> str:
        """String: the model's own request cell."""
        return f"{self.base}:m:{self.model}:req"

    @property
    def model_tokens(self) -> str:
        """String: the model's own token cell."""
        return f"{self.base}:m:{self.model}:tok"

    @property
    def scripted(self) -> list[str]:
        """The five keys the GCRA scripts take, in their order."""
        return [self.requests, self.tokens, self.state, self.model_requests, self.model_tokens]


# What the lease scripts get in place of a rate scope when nothing limits the call: never written (the
# script's rates are all zero), the braces keep them in one slot (on a cluster they are never sent).
UNLIMITED_RATE = ("{none}:req", "{none}:tok", "{none}:state", "{none}:mreq", "{none}:mtok")


def inflight(namespace: str, provider: str, model: str | None = None) -> str:
    """The run-wide bound on a provider's calls in flight (with ``model``: that model's own bound). A sorted
    set of holder tokens scored by when they expire (ms), written by :mod:`punchline.schedulers.inflight`."""
    base = f"{namespace}:inflight:{{{provider}}}"
    return base if model is None else f"{base}:m:{model}"


def calls(namespace: str, run_id: str) -> str:
    """Sorted set: the keys of a run's workers' call figures, scored by when each was last written (by the
    workers, :mod:`punchline.workers.calls.call_stats`)."""
    return f"{run_base(namespace, run_id)}:calls"


def worker_calls(namespace: str, run_id: str, worker_id: str) -> str:
    """String (JSON): one worker's call figures, written by that worker about once a second."""
    return f"{calls(namespace, run_id)}:{worker_id}"


def driver_claim(run_id: str, namespace: str = NAMESPACE) -> str:
    """String (JSON: host, pid, token): the driver's claim on a run id, with a TTL its heartbeat renews.
    Written by the driver (``schedulers/run_claim.py``); workers watch it (``workers/driver_watch.py``)."""
    return f"{namespace}:run:{run_id}:driver"
