"""The leases one worker holds right now, shards and requests, which its heartbeat renews together. Apart from
the worker's loop so the group commit and the unit runner (which mark leases held and closing through
:class:`~punchline.workers.group_commit.LeaseBook`) and their tests can use it without a processor.
"""

from __future__ import annotations

from punchline.schedulers.leases import Claim, Grant


class HeldLeases:
    """The leases a worker holds right now (renewed together by its heartbeat).

    A lease whose commit or release is on its way is *closing*: the heartbeat still renews it (the commit
    may have to wait out a Redis outage), but a renewal that finds it gone is not a loss, because the
    commit that raced the renewal removed it. Only a lease that is still held, and not closing, when the
    renewal's answer comes back was really lost."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], Grant] = {}
        self.shards: dict[int, Claim] = {}
        self.closing_requests: set[tuple[str, int]] = set()
        self.closing_shards: set[tuple[int, int]] = set()

    def hold(self, grant: Grant) -> None:
        self.requests[(grant.key, grant.token)] = grant

    def closing(self, grant: Grant) -> None:
        self.closing_requests.add((grant.key, grant.token))

    def drop(self, grant: Grant) -> None:
        self.requests.pop((grant.key, grant.token), None)
        self.closing_requests.discard((grant.key, grant.token))

    def close_shard(self, claim: Claim) -> None:
        self.closing_shards.add((claim.shard, claim.token))

    def drop_shard(self, claim: Claim) -> None:
        if self.shards.get(claim.shard) == claim:
            del self.shards[claim.shard]
        self.closing_shards.discard((claim.shard, claim.token))

    def really_lost(self, requests: list[Grant], shards: list[Claim]) -> tuple[list[Grant], list[Claim]]:
        """Of the leases a renewal found gone, those this worker neither committed nor released meanwhile."""
        lost_requests = [
            g for g in requests if (g.key, g.token) in self.requests and (g.key, g.token) not in self.closing_requests
        ]
        lost_shards = [
            c for c in shards if self.shards.get(c.shard) == c and (c.shard, c.token) not in self.closing_shards
        ]
        return lost_requests, lost_shards
