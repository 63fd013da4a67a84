"""The runs folder's keepers (the ledger's, ``services/redis_keeper.py``; the local Ray head's,
``services/ray_keeper.py``) live for a whole run beside it, one each: they import no Redis client, no logging stack,
no Ray, no telemetry. With redis-py imported (to start the ledger's server and load its scripts) the ledger's keeper
held 38 MB of RSS (25 MB without) all run long; what it says to the server goes over a bare socket
(``schedulers/server/server_info.py``). Each keeper is imported in a fresh interpreter, as ``python -m`` starts it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("redis", "structlog", "opentelemetry", "ray", "pyarrow", "numpy", "pandas", "asyncio")


@pytest.mark.parametrize("module", ["punchline.services.redis_keeper", "punchline.services.ray_keeper"])
def test_a_keeper_imports_nothing_heavy(module: str) -> None:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout)
    assert module in loaded  # the import ran
    assert sorted({m.split(".")[0] for m in loaded} & set(HEAVY)) == []
