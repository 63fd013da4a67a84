"""A model a run calls declares both its prices: left out, ``plan`` and ``run`` stop with one line naming the config
file, the provider and the model (a silent $0 would keep its calls out of the budget's sight); 0 written out is a
declared price; an offline run, which pays nothing, needs none."""

from __future__ import annotations

from pathlib import Path

import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.config import load_config
from punchline.cluster.run.planner import plan_run
from punchline.data.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
PRICED = 'sonnet = { id = "claude-sonnet-4-20250514", input_usd_per_mtok = 3.0, output_usd_per_mtok = 15.0 }'


def _config(tmp_path: Path, sonnet: str, extra: str = "") -> Path:
    """The prompts demo with its judge model's table replaced by ``sonnet``."""
    text = (REPO / "configs" / "prompts_demo.toml").read_text().replace('"../data/', f'"{REPO}/data/')
    assert PRICED in text
    path = tmp_path / "prices.toml"
    path.write_text(text.replace(PRICED, sonnet).replace("[run]\n", f"[run]\n{extra}", 1))
    return path


@pytest.mark.parametrize(
    ("sonnet", "missing"),
    [
        ('sonnet = { id = "claude-sonnet-4-20250514" }', "no input_usd_per_mtok and no output_usd_per_mtok"),
        ('sonnet = { id = "claude-sonnet-4-20250514", input_usd_per_mtok = 3.0 }', "no output_usd_per_mtok"),
    ],
)
def test_a_model_without_prices_stops_plan_and_run_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sonnet: str, missing: str
) -> None:
    path = _config(tmp_path, sonnet)
    for command in ("plan", "run"):
        assert main([command, str(path), "--runs-dir", str(tmp_path / "runs")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        for words in (f"file {path}", "field 'providers.anthropic.models.sonnet'", "provider 'anthropic'", missing):
            assert words in err, err
        assert "input_usd_per_mtok = ..., output_usd_per_mtok = ..." in err and "or 0 for each" in err, err
    assert not (tmp_path / "runs").exists()


def test_a_price_of_zero_written_out_is_declared(tmp_path: Path) -> None:
    free = 'sonnet = { id = "claude-sonnet-4-20250514", input_usd_per_mtok = 0, output_usd_per_mtok = 0.0 }'
    judge = next(e for e in plan_run(load_config(_config(tmp_path, free))) if e.stage == "judge")
    assert judge.requests > 0 and judge.cost_usd == 0.0


def test_an_unpriced_model_the_run_does_not_call_is_no_matter(tmp_path: Path) -> None:
    path = _config(tmp_path, PRICED + '\nspare = { id = "claude-spare" }')
    assert {e.stage for e in plan_run(load_config(path))} == {"generate", "judge"}


def test_an_offline_run_needs_no_prices(tmp_path: Path) -> None:
    path = _config(tmp_path, 'sonnet = { id = "claude-sonnet-4-20250514" }', extra="offline = true\n")
    judge = next(e for e in plan_run(load_config(path)) if e.stage == "judge")
    assert judge.cost_usd == 0.0
    with pytest.raises(ConfigError, match="declares no input_usd_per_mtok"):
        plan_run(load_config(_config(tmp_path, 'sonnet = { id = "claude-sonnet-4-20250514" }')))


@pytest.mark.parametrize("config", sorted(p.name for p in (REPO / "configs").glob("*.toml")))
def test_every_shipped_config_plans(tmp_path: Path, config: str) -> None:
    """The demos (and the reproduction, offline) declare the prices of every model they call."""
    text = (REPO / "configs" / config).read_text().replace('"../data/', f'"{REPO}/data/')
    path = tmp_path / config
    path.write_text(text)
    if config == "puns_reproduce.toml":  # its inputs are upstream's: only the price rule is asked of it
        assert load_config(path).run.offline
        return
    assert plan_run(load_config(path))
