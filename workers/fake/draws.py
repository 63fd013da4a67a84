"""The fake provider's one source of chance: a number in [0, 1) drawn from a hash, not a random generator.

Why a module of its own: the online endpoints (:mod:`punchline.workers.fake.handler`: latency, faults) and the
batch endpoints (:mod:`punchline.workers.fake.batches`: expired and failed requests) both decide by it, and
:mod:`punchline.workers.fake.state` imports the batches, so neither of those can hold it for the other. Being a
hash of the seed and the call's parts, the same calls see the same draws whatever the timing (see the
determinism rules in :mod:`punchline.workers.fake.server`).
"""

from __future__ import annotations

import hashlib


def unit(seed: int, *parts: object) -> float:
    """A number in [0, 1) from the first 64 bits of the sha256 of ``seed|part|part...``."""
    digest = hashlib.sha256("|".join(str(p) for p in (seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
