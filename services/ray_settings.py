"""How a run's Ray is sized and found: :class:`RaySettings`, read from the environment.

It lives with the runs folder's services because the local Ray head (:mod:`punchline.services.local_ray`) is
started from it; :mod:`punchline.cluster.ray_cluster.ray_runtime` starts or joins Ray with the same settings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec

from punchline.data.settings import RAY_ADDRESS, RAY_NUM_CPUS

NAMESPACE = "punchline"
# Ray refuses less than ~75 MB; 200 MB keeps a laptop/CI node light. Our payloads are small
# (msgpack'ed plans and reports); bulk data goes through the store, not the object store.
DEFAULT_OBJECT_STORE_BYTES = 200 * 1024 * 1024
# Configuration (never credentials) that code in workers reads from the environment: copied
# from the driver's environment into every worker by ``from_env``. Credentials come from the
# nodes themselves (instance profile / pod identity), never through Ray's runtime_env, which
# is stored in the GCS and shown by the dashboard.
FORWARD_ENV = (
    "PUNCHLINE_S3_ENDPOINT_URL",
    "PUNCHLINE_S3_ADDRESSING_STYLE",
    "PUNCHLINE_S3_OUTAGE_S",
    "AWS_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
)


class RaySettings(msgspec.Struct, frozen=True, kw_only=True):
    """``address=None`` starts a local Ray sized by ``num_cpus``/``object_store_bytes``; the
    sizing fields are ignored when joining a cluster (the cluster decides)."""

    address: str | None = None
    num_cpus: int | None = None
    object_store_bytes: int | None = DEFAULT_OBJECT_STORE_BYTES
    namespace: str = NAMESPACE
    env_vars: dict[str, str] = msgspec.field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RaySettings:
        """``PUNCHLINE_RAY_ADDRESS`` (else ``RAY_ADDRESS``); ``PUNCHLINE_RAY_NUM_CPUS`` for local;
        the ``FORWARD_ENV`` variables that are set, for the workers."""
        source = os.environ if env is None else env
        address = RAY_ADDRESS.get(env) or source.get("RAY_ADDRESS", "").strip() or None  # Ray's own, under ours
        forwarded = {name: source[name] for name in FORWARD_ENV if source.get(name)}
        return cls(address=None if address == "local" else address, num_cpus=RAY_NUM_CPUS.get(env), env_vars=forwarded)

    @property
    def is_local(self) -> bool:
        return self.address is None
