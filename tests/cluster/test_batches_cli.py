"""``punchline batches RUN_ID --cancel`` asks the provider to cancel the run's open batches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from punchline.cluster.cli import main
from punchline.cluster.driver import RunRecord, Services
from punchline.data.puns.completions import sample_request
from punchline.data.stores.local import LocalStore
from punchline.schedulers.batches import BatchRecord, record_path
from punchline.workers.fake import FakeProviderServer
from punchline.workers.providers import make_batch_provider

MODEL = "meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo"


def test_cancel_asks_the_provider_and_lists_the_result(tmp_path: Path, fake: FakeProviderServer, capsys: Any) -> None:
    fake.configure(batch_delay_s=300)  # still processing when we cancel
    settings = fake.provider_settings("openai")
    client = make_batch_provider("fake", settings)
    request = sample_request("fake", MODEL, "The baker was happy because he kneaded the", n=2)
    info = client.create("k1", [request])
    store = LocalStore(tmp_path / "store")
    record = BatchRecord(
        batch_key="k1",
        run_id="r1",
        stage="collect",
        provider="fake",
        keys=[request.key()],
        requests=1,
        state="submitted",
        batch_id=info.batch_id,
    )
    store.put(record_path("r1", "k1"), msgspec.json.encode(record))
    run = RunRecord(
        run_id="r1",
        pipeline="puns",
        config_path="run.toml",
        config_toml=f'[providers.fake]\nkind = "openai"\nbase_url = "{settings.base_url}"\n',
        created_at=0.0,
        services=Services(redis_url="redis://127.0.0.1:1/0", store_url=store.url),
        stages=["collect"],
    )
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "run.json").write_bytes(msgspec.json.encode(run))

    assert main(["batches", "r1", "--runs-dir", str(tmp_path / "runs"), "--cancel", "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"cancelled {info.batch_id} (fake): ")
    listed = json.loads(out[-1])
    assert [b["batch_id"] for b in listed] == [info.batch_id] and listed[0]["provider_status"]
    after = client.retrieve(info.batch_id)
    assert "cancel" in after.provider_status and after.succeeded == 0
    client.close()
