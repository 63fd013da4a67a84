"""The leases one worker holds right now, shards and requests, which its heartbeat renews together. Apart from
the worker's loop so the group commit and the unit runner (which mark leases held and closing through
:class:`~punchline.workers.group_commit.LeaseBook`) and their tests can use it without a processor.
"""

from __future__ import annotations

from punchline.data.errors import PunchlineError
from punchline.schedulers.leases import Claim, Grant


class LeaseLost(PunchlineError):
    """A unit's request lease was lost while it ran: its outcome is not recorded, and its shard goes back
    unwritten (the lease's next holder answers it, or the shard's next claim asks again)."""


class HeldLeases:
    """The leases a worker holds right now (renewed together by its heartbeat).

    A lease whose commit or release is on its way is *closing*: the heartbeat still renews it (the commit
    may have to wait out a Redis outage), but a renewal that finds it gone is not a loss, because the
    commit that raced the renewal removed it. Only a lease that is still held, and not closing, when the
    renewal's answer comes back was really lost.

    A lease really lost stays marked (:meth:`lose`) until its holder drops it: the units and the shard under it
    record nothing (no shard file, no failure), since the lease is someone else's now or will be (expired, taken
    over, a resume's rebuilt queue), and what they saw may be only what losing it did to them."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], Grant] = {}
        self.shards: dict[int, Claim] = {}
        self.closing_requests: set[tuple[str, int]] = set()
        self.closing_shards: set[tuple[int, int]] = set()
        self.lost_requests: set[tuple[str, int]] = set()
        self.lost_shards: set[tuple[int, int]] = set()

    def hold(self, grant: Grant) -> None:
        self.requests[(grant.key, grant.token)] = grant

    def closing(self, grant: Grant) -> None:
        self.closing_requests.add((grant.key, grant.token))

    def drop(self, grant: Grant) -> None:
        self.requests.pop((grant.key, grant.token), None)
        self.closing_requests.discard((grant.key, grant.token))
        self.lost_requests.discard((grant.key, grant.token))

    def lost(self, grant: Grant) -> bool:
        """A renewal found this request lease gone while it was held (not closing)."""
        return (grant.key, grant.token) in self.lost_requests

    def close_shard(self, claim: Claim) -> None:
        self.closing_shards.add((claim.shard, claim.token))

    def drop_shard(self, claim: Claim) -> None:
        if self.shards.get(claim.shard) == claim:
            del self.shards[claim.shard]
        self.closing_shards.discard((claim.shard, claim.token))
        self.lost_shards.discard((claim.shard, claim.token))

    def shard_lost(self, claim: Claim) -> bool:
        """A renewal found this shard lease gone while it was held (not closing)."""
        return (claim.shard, claim.token) in self.lost_shards

    def really_lost(self, requests: list[Grant], shards: list[Claim]) -> tuple[list[Grant], list[Claim]]:
        """Of the leases a renewal found gone, those this worker neither committed nor released meanwhile."""
        lost_requests = [
            g for g in requests if (g.key, g.token) in self.requests and (g.key, g.token) not in self.closing_requests
        ]
        lost_shards = [
            c for c in shards if self.shards.get(c.shard) == c and (c.shard, c.token) not in self.closing_shards
        ]
        return lost_requests, lost_shards

    def lose(self, requests: list[Grant], shards: list[Claim]) -> None:
        """Mark leases really lost (:meth:`really_lost`'s answer): :meth:`lost` and :meth:`shard_lost` say so."""
        self.lost_requests.update((g.key, g.token) for g in requests)
        self.lost_shards.update((c.shard, c.token) for c in shards)
