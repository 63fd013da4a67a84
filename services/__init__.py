"""The runs folder's own services, shared by its drivers: the embedded Redis server (the ledger) and the local Ray
head, each the child of a keeper process that holds the folder (``keeper.py``), and the folder's private files.

Below the engine (``cluster/`` starts them through :mod:`punchline.cluster.run.run_services`); they speak Redis
only through ``schedulers/``."""
