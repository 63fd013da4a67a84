"""punchline: fault-tolerant, resumable LLM data-collection and evaluation pipelines on Ray, Redis and S3.

One importable package whose layers are the repository's top-level folders (linked here), lowest
first: ``data`` (shared vocabulary, schemas, stores) <- ``schedulers`` (the Redis ledger, limits,
budget) <- ``workers`` (actors, providers) <- ``cluster`` (coordinator, driver, pipelines, commands).

``punchline.run(config)``, ``punchline.status(run_id)`` and ``punchline.prompts(data, template=...,
models=...)`` (a DataFrame in, a DataFrame out) are the Python API (:mod:`punchline.api`),
imported on first use so that ``import punchline`` stays cheap (no Ray, no Redis client).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from punchline.api import RunRecord, artifact_url, prompts, run, status

__version__ = "0.1.0"
__all__ = ["RunRecord", "__version__", "artifact_url", "prompts", "run", "status"]
_API = frozenset({"RunRecord", "artifact_url", "prompts", "run", "status"})


def __getattr__(name: str) -> Any:
    if name in _API:
        import punchline.api

        return getattr(punchline.api, name)
    raise AttributeError(f"module 'punchline' has no attribute {name!r}")
