"""Issue 39 item 1: ``max_cost_usd`` is never overspent, online or in batches, however a provider tokenizes.

The case the review measured: the prompts demo with ``max_tokens = 4`` and OpenAI-compatible models only, whose
run cost $0.001068, capped at $0.0008 and $0.00055; batches priced at characters / 4 were all created and spent
1.34x and 1.94x the cap (exit 0, "finished"). Here the fake provider bills the worst case a real tokenizer can
(``billing = "worst_case"``: every UTF-8 byte of input a token, plus a chat template's, and ``max_tokens`` per
answer), the caps are the same shares of what the run costs so billed, and each run goes through the CLI: it must
end with exit 2 and the one line saying what is unanswered and how to raise the cap, having spent no more than the
cap (the batch records and the status say what the provider billed)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.config import load_config
from punchline.cluster.run.planner import plan_run
from punchline.data.stores.local import LocalStore
from punchline.schedulers.batches import read_records
from punchline.schedulers.budget import Budget
from punchline.schedulers.server.redis_client import connect
from punchline.workers.fake.server import FakeProviderServer
from tests.cluster.run.test_faults import ROOT

pytestmark = pytest.mark.slow

DEMO = ROOT / "configs" / "prompts_demo.toml"
REVIEWED_RUN_USD = 0.001068  # what the reviewed run cost; its caps below are shares of it
CAPS_USD = (0.0008, 0.00055)


def demo_config(tmp: Path, fake: FakeProviderServer, mode: str) -> Path:
    """The prompts demo as the review ran it: ``max_tokens = 4``, its OpenAI-compatible provider only (no judge),
    pointed at the fake provider; batches of 6 requests, so that the cap falls between batches."""
    text = DEMO.read_text()
    text = text[: text.index("[prompts.judge]")]  # the judge is the demo's Anthropic model
    head, anthropic = text.index("[providers.anthropic]"), text.index("[prompts]")
    text = text[:head] + text[anthropic:]
    text = text[: text.index("[simulator]")] + text[text.index("[providers.together]") :]
    text = text.replace("max_tokens = 64", "max_tokens = 4").replace('api_key_env = "TOGETHER_API_KEY"\n', "")
    text = text.replace('base_url = "simulated"', f'base_url = "{fake.openai_base_url}"\nmode = "{mode}"')
    text = text.replace("max_concurrency = 8", "max_concurrency = 8\nbatch_max_requests = 6")
    text = text.replace('"../data/samples/prompts_sample.jsonl"', f'"{ROOT / "data/samples/prompts_sample.jsonl"}"')
    assert "[providers.anthropic]" not in text and "api_key_env =" not in text
    assert "max_tokens = 4" in text and f'mode = "{mode}"' in text
    path = tmp / f"demo-{mode}.toml"
    path.write_text(text)
    return path


def capped_run(tmp: Path, redis_url: str, cfg: Path, run_id: str, cap_usd: float, capsys: Any) -> tuple[int, str]:
    """``punchline run`` through the CLI with ``--max-cost-usd``: its exit status and what it wrote on stderr."""
    capsys.readouterr()
    code = main(
        [
            "run",
            str(cfg),
            "--run-id",
            run_id,
            "--store",
            str(tmp / f"store-{run_id}"),  # a store of its own: no answer cached by another case
            "--runs-dir",
            str(tmp / "runs"),
            "--redis-url",
            redis_url,
            "--max-cost-usd",
            repr(cap_usd),
            "--no-progress",
        ]
    )
    return code, capsys.readouterr().err


def status_spend_usd(tmp: Path, run_id: str, capsys: Any) -> float:
    """What ``status`` says the run spent: the online calls' costs plus every batch record's, as billed."""
    capsys.readouterr()
    assert main(["status", run_id, "--runs-dir", str(tmp / "runs"), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    return sum(c["cost_usd"] for c in view["counters"].values())


def the_line(err: str) -> str:
    """The one line the CLI ends a stopped run with."""
    lines = [line for line in err.splitlines() if line.startswith("punchline: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("reviewed_cap_usd", CAPS_USD)
def test_batches_are_held_at_their_worst_case_bill_and_spend_stays_under_the_cap(
    tmp_path: Path, fake: FakeProviderServer, redis_url: str, ray_local: Any, capsys: Any, reviewed_cap_usd: float
) -> None:
    fake.configure(billing="worst_case")
    cfg = demo_config(tmp_path, fake, "batch")
    run_usd = sum(e.mode_cost_usd for e in plan_run(load_config(cfg)))  # the bound, which worst_case bills
    cap_usd = run_usd * reviewed_cap_usd / REVIEWED_RUN_USD
    run_id = f"batch-{reviewed_cap_usd}"
    code, err = capped_run(tmp_path, redis_url, cfg, run_id, cap_usd, capsys)
    records = read_records(LocalStore(tmp_path / f"store-{run_id}"), run_id)
    created = [r for r in records if r.batch_id]
    refused = [r for r in records if not r.batch_id]
    spent_usd = sum(r.cost_usd for r in created)
    shown_usd = status_spend_usd(tmp_path, run_id, capsys)
    with capsys.disabled():
        print(f"\nbatch mode: cap ${cap_usd:.6f}, spent ${spent_usd:.6f} ({spent_usd / cap_usd:.2f} of the cap)")
    assert code == 2, err
    line = the_line(err)
    assert "not created" in line and "max_cost_usd" in line and "requests are unanswered" in line, line
    assert "resume with a higher --max-cost-usd" in line, line
    assert created and refused, [(r.state, r.estimate_usd) for r in records]  # the cap fell between batches
    # each created batch was billed its worst case, which is what it held: the bound is exact, never short
    assert all(r.state == "collected" and r.cost_usd == pytest.approx(r.estimate_usd) for r in created)
    assert 0 < spent_usd <= cap_usd
    assert shown_usd == pytest.approx(spent_usd)
    assert fake.batch_stats().batches_created == len(created)
    assert json.loads((tmp_path / "runs" / run_id / "run.json").read_text())["state"] == "budget"


def test_online_calls_are_held_at_their_worst_case_bill_and_spend_stays_under_the_cap(
    tmp_path: Path, fake: FakeProviderServer, redis_url: str, ray_local: Any, capsys: Any
) -> None:
    fake.configure(billing="worst_case")
    cfg = demo_config(tmp_path, fake, "online")
    run_usd = sum(e.mode_cost_usd for e in plan_run(load_config(cfg)))
    cap_usd = run_usd * CAPS_USD[1] / REVIEWED_RUN_USD
    code, err = capped_run(tmp_path, redis_url, cfg, "online", cap_usd, capsys)
    stats = fake.stats()
    together = load_config(cfg).provider("together")
    billed_usd = sum(together.cost_usd(model, i, o) for model, (i, o) in stats.tokens_by_model.items())
    settled_usd = Budget(connect(redis_url), "online", None).spent_usd()
    shown_usd = status_spend_usd(tmp_path, "online", capsys)
    with capsys.disabled():
        print(
            f"\nonline: cap ${cap_usd:.6f}, billed ${billed_usd:.6f} ({billed_usd / cap_usd:.2f} of the cap), the "
            f"budget settled ${settled_usd:.6f}, status shows ${shown_usd:.6f}; {stats.ok} calls"
        )
    assert code == 2, err
    line = the_line(err)
    assert "would exceed the budget (max_cost_usd)" in line and "resume with a higher --max-cost-usd" in line, line
    unanswered = re.search(r"(\d+) of its 72 units are not done", line)
    assert unanswered is not None and int(unanswered[1]) >= 72 - stats.ok, line
    assert 0 < stats.ok < 72  # it called, and stopped before the run's 72 requests
    assert 0 < billed_usd <= cap_usd  # what the provider billed, whatever the run's own counters say
    assert settled_usd == pytest.approx(billed_usd)  # every call's bill reached the budget
    assert json.loads((tmp_path / "runs" / "online" / "run.json").read_text())["state"] == "budget"
