"""A provider kind that runs offline is its own module and one entry point: here a made-up JSON API (``talk``),
its provider and its simulated wire in one module importing only ``punchline.plugin``, installed through a
dist-info for the test; a run against ``base_url = "simulated"`` then speaks it, answers as an OpenAI run of the
same config does (the simulator answers the neutral request, whatever the wire), and the simulated provider's
errors come back in its shape."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from punchline.data.errors import FatalProviderError
from punchline.plugin import Message, ProviderRequest
from punchline.workers.fake.server import FakeProviderServer
from punchline.workers.providers import make_provider
from tests.fixtures.kinds import install_kind

TALK_KIND = '''
"""The talk API: POST {base}/ask {"engine", "turns": [{"who", "say"}], "heat", "limit", "copies", "halt", "seed"}
-> {"outputs": [{"say"}], "spent": {"in", "out"}}; an error is {"problem": {"code", "text"}}."""

import httpx2

from punchline.plugin import (
    ProviderKind,
    ProviderResponse,
    RetryableProviderError,
    SimulatedWire,
    WireRequest,
    status_error,
)


class TalkProvider:
    def __init__(self, name, settings):
        self.name, self.settings = name, settings
        self._http = httpx2.AsyncClient(timeout=settings.timeout_s)

    async def aclose(self):
        await self._http.aclose()

    async def complete(self, request):
        where = f"{self.name}/{request.model}"
        body = {
            "engine": request.model,
            "turns": [{"who": m.role, "say": m.content} for m in request.messages],
            "heat": request.temperature,
            "limit": request.max_tokens,
            "copies": request.n,
            "halt": list(request.stop),
            "seed": request.seed,
        }
        try:
            resp = await self._http.post(f"{self.settings.base_url}/ask", json=body)
        except httpx2.HTTPError as exc:
            raise RetryableProviderError(f"{where}: {exc}") from None
        if resp.status_code != 200:
            raise status_error(where, resp.status_code, resp.json()["problem"]["text"], resp.headers, "")
        data = resp.json()
        texts = [o["say"] for o in data["outputs"]]
        return ProviderResponse(texts=texts, input_tokens=data["spent"]["in"], output_tokens=data["spent"]["out"])


class TalkWire(SimulatedWire):
    name = "talk"
    base_path = "/talk"
    paths = ("/talk/ask",)

    def parse(self, body):
        if not body.get("engine") or not body.get("turns"):
            raise ValueError("engine and turns are required")
        turns = [(t["who"], t["say"]) for t in body["turns"]]
        halt = list(body.get("halt") or [])
        copies, seed = int(body.get("copies") or 1), body.get("seed")
        return WireRequest(body["engine"], turns, float(body["heat"]), body.get("limit"), copies, halt, seed)

    def answer(self, request, texts, input_tokens, output_tokens):
        return {"outputs": [{"say": t} for t in texts], "spent": {"in": input_tokens, "out": output_tokens}}

    def error(self, status, message):
        return {"problem": {"code": status, "text": message}}


WIRE = TalkWire()
KIND = ProviderKind("talk", "talk_kind:TalkProvider", simulated_wire="talk_kind:WIRE", summary="a made-up API")
'''


def _config(folder: Path, kind: str) -> Path:
    rows = folder / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": f"q{i}", "q": f"what is {i} + {i}?"}) + "\n" for i in range(6)))
    path = folder / f"{kind}.toml"
    path.write_text(
        f"""
[run]
pipeline = "prompts"
shard_size = 4

[providers.p]
kind = "{kind}"
base_url = "simulated"

[providers.p.models]
m = {{ id = "sim/m", input_usd_per_mtok = 0.0, output_usd_per_mtok = 0.0 }}

[prompts]
data = "{rows}"
provider = "p"
models = ["m"]
n = 2
temperature = 0.7
prompt = "{{{{ q }}}}"
"""
    )
    return path


@pytest.fixture
def talk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_kind(tmp_path, monkeypatch, "talk", "talk_kind", TALK_KIND)


# The run goes in a fresh interpreter, as a user's would: a test worker that has joined a Ray earlier in the session
# keeps it, and that Ray's workers started before the kind was installed (they would not find it on their path).
_RUN = """
import json, sys
from punchline.plugin import run_simulated
done = run_simulated(sys.argv[1], tmp_dir=sys.argv[2])
texts = [r["text"] for r in done.rows("outputs.jsonl")]
print(json.dumps({"state": done.record.state, "failures": str(done.record.failures), "calls": done.calls,
                  "texts": texts}))
"""


def _run_simulated(config: Path, tmp_dir: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _RUN, str(config), str(tmp_dir)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.usefixtures("talk")
def test_a_kind_brings_its_wire_and_a_stage_runs_offline_on_it(tmp_path: Path) -> None:
    talked = _run_simulated(_config(tmp_path, "talk"), tmp_path / "talk")
    assert talked["state"] == "finished", talked["failures"]
    assert talked["calls"] == 6  # 6 rows x 1 model, n = 2 in one call
    outputs = talked["texts"]
    assert len(outputs) == 12 and all(outputs)
    # the simulator answered the neutral request: the same texts as the same run over the OpenAI wire
    spoken = _run_simulated(_config(tmp_path, "openai"), tmp_path / "openai")
    assert outputs == spoken["texts"]


@pytest.mark.usefixtures("talk")
def test_the_simulator_serves_the_kind_at_its_paths_and_errs_in_its_shape() -> None:
    with FakeProviderServer() as fake:  # started after the kind was installed: it finds its wire
        settings = fake.provider_settings("talk", timeout_s=5)
        assert settings.base_url == f"{fake.url}/talk"
        fake.configure(status_for_model={"sim/refused": 404})
        provider = make_provider("p", settings)

        async def ask() -> tuple[list[str], BaseException | None]:
            try:
                texts = (await provider.complete(_request("sim/m"))).texts
                try:
                    await provider.complete(_request("sim/refused"))
                except FatalProviderError as exc:
                    return texts, exc
                return texts, None
            finally:
                await provider.aclose()

        texts, refused = asyncio.run(ask())
        assert texts and texts[0]
        # the error body was the talk API's ({"problem": {"text"}}), read by the kind's own provider
        assert "HTTP 404: model 'sim/refused' answered 404 by configuration" in str(refused)
        assert fake.stats().total_calls == 2


def _request(model: str) -> ProviderRequest:
    return ProviderRequest(provider="p", model=model, messages=(Message("user", "hello"),), max_tokens=32)
