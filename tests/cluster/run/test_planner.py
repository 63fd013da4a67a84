"""``punchline plan`` expands a config without calling anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.config import load_config
from punchline.cluster.run.planner import plan_run
from punchline.workers.fake.server import FakeProviderServer


def test_plan_counts_the_collect_requests_exactly(make_config, fake: FakeProviderServer, capsys) -> None:
    cfg_path: Path = make_config(jokes=5, models=("3b", "70b"), samples=4, classify=True)
    estimates = {e.stage: e for e in plan_run(load_config(cfg_path))}
    collect = estimates["collect"]
    assert collect.exact and collect.requests == 5 * 2 * 2
    # prices are 1 $/Mtok in and 2 $/Mtok out: the cost follows the token estimate
    assert abs(collect.cost_usd - (collect.input_tokens * 1 + collect.output_tokens * 2) / 1e6) < 1e-12
    assert collect.output_tokens == 5 * 2 * (5 * 1 + 5 * 4)  # max_tokens 5 per choice, greedy n=1 and samples n=4
    assert not estimates["classify"].exact and estimates["classify"].requests == 1
    assert fake.stats().total_calls == 0
    assert main(["plan", str(cfg_path)]) == 0
    assert "collect" in capsys.readouterr().out


def test_plan_least_wall_time_follows_the_rate_limit(tmp_path: Path, make_config) -> None:
    cfg_path: Path = make_config(jokes=6, models=("3b",), samples=2)
    text = cfg_path.read_text().replace("max_concurrency = 4\n", "max_concurrency = 4\nrequests_per_minute = 6\n", 1)
    cfg_path.write_text(text)
    (collect,) = [e for e in plan_run(load_config(cfg_path)) if e.stage == "collect"]
    assert collect.requests == 12
    assert abs(collect.min_wall_s - 12 / 6 * 60) < 1e-9


def test_plan_shows_the_batch_price_beside_the_online_price() -> None:
    from punchline.cluster.config import load_config
    from punchline.cluster.run.planner import plan_run

    estimates = plan_run(load_config(Path(__file__).resolve().parents[3] / "configs" / "demo.toml"))
    priced = [e for e in estimates if e.cost_usd > 0]
    assert priced
    assert all(e.batch_cost_usd == pytest.approx(e.cost_usd / 2) for e in priced)


def test_plan_shows_only_the_cost_of_the_mode_configured(make_config, capsys) -> None:
    online: Path = make_config(jokes=4, models=("3b",), samples=2, classify=True)
    assert main(["plan", str(online)]) == 0
    header = capsys.readouterr().out
    assert "cost $" in header and "batch" not in header
    batch = online.with_name("batch.toml")
    text = online.read_text()
    for table in ("[providers.sim]\n", "[providers.claude]\n"):
        text = text.replace(table, f'{table}mode = "batch"\n')
    batch.write_text(text)
    by_stage = {e.stage: e for e in plan_run(load_config(batch))}
    collect = by_stage["collect"]
    assert collect.mode == "batch" and collect.cost_usd > 0
    assert collect.mode_cost_usd == pytest.approx(collect.cost_usd / 2)
    assert main(["plan", str(batch)]) == 0
    shown = capsys.readouterr().out
    assert "batch cost $" in shown and f"{collect.mode_cost_usd:.4f}" in shown
    assert f"{collect.cost_usd:.4f}" not in shown  # the online price of a batch-mode stage is not shown


def test_plan_warns_when_max_cost_usd_is_below_the_estimate(make_config, capsys) -> None:
    """Issue 34: a cap below what the run may cost as configured (batches at the batch price) is said by `plan`,
    on stderr (its --json stays one document); a cap above it, or none, says nothing."""
    cfg: Path = make_config(jokes=4, models=("3b",), samples=2)
    text = cfg.read_text().replace("[providers.sim]\n", '[providers.sim]\nmode = "batch"\n', 1)
    total = 0.0
    for cap, warned in [(None, False), (1e-9, True), (1_000.0, False)]:
        capped = text.replace("[run]\n", f"[run]\nmax_cost_usd = {cap}\n", 1) if cap is not None else text
        cfg.write_text(capped)
        total = sum(e.mode_cost_usd for e in plan_run(load_config(cfg)))
        assert main(["plan", str(cfg), "--json"]) == 0
        captured = capsys.readouterr()
        assert captured.out.startswith("[")  # the JSON alone on stdout
        assert ("warning: max_cost_usd" in captured.err) is warned, captured.err
        if warned:
            assert f"${total:.4g}" in captured.err and "batch price" in captured.err
    assert total > 0
