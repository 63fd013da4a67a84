"""``punchline view``: a local web viewer over a run's store.

It reads the store's own files (run record, plan pages, shard files, artifacts) a page at a time and keeps a
small index per stage (each unit's model and prompt digest, each shard's first unit), so a run of a million
units opens and pages without being loaded whole. The Prometheus text of a run's counters is the engine's
(:mod:`punchline.cluster.records.metrics`: the driver serves it during a run, the viewer beside its pages).
"""
