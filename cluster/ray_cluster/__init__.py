"""Ray beyond one machine: the runtime a run's workers get, Ray jobs, the autoscaler and the shared store a cluster's
nodes read."""
