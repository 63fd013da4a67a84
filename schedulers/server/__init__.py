"""The ledger's Redis server itself: connecting to it (``redis_client``), reading it over a bare socket where a
long-lived keeper must stay small (``server_info``), who may run what on it and the scripts it holds
(``ledger_rules``, ``ledger_access``), and what is checked on it before a run (``server_checks``)."""
