"""One provider call as a worker makes it: retried by its kind's rule, its answer validated, the provider built at its
first call, and counted for ``/metrics``."""
