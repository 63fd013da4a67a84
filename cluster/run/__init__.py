"""A run from its start to its end: the driver, its checks and services, the coordinator, the executors (shards,
batches) and the plan."""
