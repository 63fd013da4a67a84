"""The executors of a stage (the interface is :mod:`punchline.cluster.run.executor`): ``shards`` (workers call the
providers online) and ``batches`` (provider batch APIs first, then the shards find the answers cached)."""
