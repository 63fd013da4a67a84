"""punchline: fault-tolerant, resumable LLM data-collection and evaluation pipelines on Ray, Redis and S3.

One importable package whose layers are the repository's top-level folders (linked here), lowest
first: ``data`` (shared vocabulary, schemas, stores) <- ``schedulers`` (the Redis ledger, limits,
budget) <- ``workers`` (actors, providers) <- ``cluster`` (coordinator, driver, pipelines, commands).
"""

__version__ = "0.1.0"
