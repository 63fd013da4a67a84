"""``punchline humor submission RUN``: MERA's ``Humor.json`` + sample logs, read back as MERA's packer reads them.

The reader below transcribes MERA-Evaluation/MERA ``scripts/log_to_submission_v2.py`` at
ce16dba769b38f2ff236f335006beae350f254a8 (``load_jsonl``, ``run_stamp``, ``extract_date``,
``latest_samples_file``, ``outputs_to_submission``): packing our sample logs with it must give our ``Humor.json``.
"""

from __future__ import annotations

import glob
import json
import os
import time
import zipfile
from datetime import datetime
from pathlib import Path

import msgspec
import pytest

from punchline.cluster.cli.main import main
from punchline.cluster.run.driver import RunRecord, Services
from punchline.pipelines.humor.data.loaders import load_items

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "data" / "samples" / "humor_sample.json"

# --- log_to_submission_v2.py, transcribed ------------------------------------------------------------------

SAMPLES_PREFIX = "samples_"
RESULTS_PREFIX = "results_"
DATE_FORMAT = "%Y-%m-%dT%H-%M-%S.%f"


def load_jsonl(path: str) -> list[dict]:  # type: ignore[type-arg]
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]


def run_stamp(file_name: str) -> str:
    return os.path.basename(file_name).split(".json")[0].split("_")[-1]


def extract_date(file_name: str) -> datetime:
    return datetime.strptime(run_stamp(file_name), DATE_FORMAT)


def latest_samples_file(outputs_dir: str, task: str) -> str:
    files = glob.glob(os.path.join(outputs_dir, f"{SAMPLES_PREFIX}{task}_*.json*"))
    if not files:
        raise FileNotFoundError(f"no samples file for `{task}` in {outputs_dir}")
    return sorted(files, key=extract_date, reverse=True)[0]


def outputs_to_submission(rows: list[dict]) -> dict:  # type: ignore[type-arg]
    data = []
    for row in rows:
        answer = row["filtered_resps"]
        if isinstance(answer, list):
            answer = answer[0] if answer else ""
        data.append(
            {
                "outputs": answer,
                "meta": {"id": int(row["doc"]["meta"]["id"])},
            }
        )
    return {"data": {"test": data}}


# --- a finished run, laid out as the engine leaves it ---------------------------------------------------------


def _fake_run(tmp_path: Path, answers: list[tuple[int, str]], run_id: str = "humor-1") -> tuple[Path, str]:
    cfg = tmp_path / "humor.toml"
    cfg.write_text(
        f"""
[run]
pipeline = "humor"

[providers.sim]
kind = "openai"
base_url = "http://127.0.0.1:9"

[providers.sim.models]
m = {{ id = "sim/m" }}

[humor]
data = "{SAMPLE}"
provider = "sim"
models = ["m"]
""",
        encoding="utf-8",
    )
    store = tmp_path / "store"
    runs = tmp_path / "runs"
    lines = "".join(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n" for i, t in answers)
    (store / run_id / "artifacts" / "answers").mkdir(parents=True)
    (store / run_id / "artifacts" / "answers" / "m.jsonl").write_text(lines, encoding="utf-8")
    record = RunRecord(
        run_id=run_id,
        pipeline="humor",
        config_path=str(cfg),
        config_toml=cfg.read_text(encoding="utf-8"),
        created_at=time.time(),
        services=Services(redis_url="redis://127.0.0.1:1", store_url=str(store), ray_address="local"),
        stages=["generate"],
        state="finished",
    )
    (runs / run_id).mkdir(parents=True)
    (runs / run_id / "run.json").write_bytes(msgspec.json.encode(record))
    return runs, run_id


def _texts() -> list[tuple[int, str]]:
    out = []
    for k, item in enumerate(load_items(SAMPLE)):
        cls, letter = item.outputs.split(",")
        text = [f"ОТВЕТ {cls}\nРЕШЕНИЕ {letter}", f"  Думаю, {cls} или ирония.\nОтвет: {cls},{letter}", ""][k % 3]
        out.append((item.id, text))
    return out


def test_submission_is_what_meras_packer_reads_from_the_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = _texts()
    runs, run_id = _fake_run(tmp_path, texts)
    out = tmp_path / "sub"
    assert main(["humor", "submission", run_id, "--runs-dir", str(runs), "--out", str(out)]) == 0
    assert "Humor.json" in capsys.readouterr().out
    ours = json.loads((out / "m" / "Humor.json").read_text(encoding="utf-8"))
    # the model's own text (lstripped by the filter chain), in item order, with the ids
    assert ours == {"data": {"test": [{"outputs": t.lstrip(), "meta": {"id": i}} for i, t in texts]}}

    logs = tmp_path / "logs"
    with zipfile.ZipFile(out / "m" / "logs_public.zip") as zf:
        zf.extractall(logs)
    samples = latest_samples_file(str(logs), "humor")
    assert outputs_to_submission(load_jsonl(samples)) == ours
    results = glob.glob(os.path.join(logs, f"{RESULTS_PREFIX}*.json*"))
    assert [run_stamp(r) for r in results] == [run_stamp(samples)]  # the results travel with their samples
    rows = load_jsonl(samples)
    assert [r["resps"] for r in rows] == [[[t]] for _, t in texts]
    assert all(r["arguments"]["gen_args_0"]["arg_1"]["until"] == ["\n\n"] for r in rows)

    with zipfile.ZipFile(out / "m.zip") as zf:  # the folder's archive, as the script's final make_archive
        assert sorted(zf.namelist()) == ["Humor.json", "logs_public.zip"]
        assert json.loads(zf.read("Humor.json")) == ours


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: [*t, t[0]], "answered twice"),
        (lambda t: t[:-2], "2 test item(s) have no answer"),
        (lambda t: [*t, (99999, "x")], "99999 is not a test item"),
    ],
)
def test_duplicate_or_missing_ids_are_one_line_errors(tmp_path: Path, capsys, edit, message) -> None:  # type: ignore[no-untyped-def]
    runs, run_id = _fake_run(tmp_path, edit(_texts()))
    out = tmp_path / "sub"
    assert main(["humor", "submission", run_id, "--runs-dir", str(runs), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "answers/m.jsonl" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()  # nothing written


def test_unknown_run_and_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs, run_id = _fake_run(tmp_path, _texts())
    assert main(["humor", "submission", "nope", "--runs-dir", str(runs)]) == 2
    assert "no such run" in capsys.readouterr().err
    assert main(["humor", "submission", run_id, "--runs-dir", str(runs), "--model", "x", "--out", str(tmp_path)]) == 2
    assert "not a model" in capsys.readouterr().err
