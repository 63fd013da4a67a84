"""The generate stage's reduce streams: it reads a multi-shard stage a few shards at a time (``ShardResults``), and
writes ``outputs.jsonl`` line by line and ``outputs.parquet`` a row group at a time; what it writes equals what
the same rows give written in one piece, and each row's request key is its planned request's."""

from __future__ import annotations

import io
import json
from pathlib import Path

import msgspec
import pyarrow.parquet as pq

from punchline.cluster.config import load_config
from punchline.cluster.pipeline import StageContext
from punchline.cluster.stages.generate import GenerateStage, Job
from punchline.cluster.stages.outputs import (
    TABLE_SLICE,
    OutputRow,
    jsonl_chunks,
    parquet_chunks,
    read_jsonl,
    read_jsonl_chunks,
)
from punchline.data.requests import ProviderResponse
from punchline.data.stores.local import LocalStore
from punchline.data.units import ShardOutput, ShardResults, ShardUsage, UnitResult, UnitSpec

ROWS = 53
SHARD = 7
CONFIG = """[run]
pipeline = "prompts"

[providers.sim]
kind = "openai"
base_url = "simulated"

[providers.sim.models]
a = {{ id = "sim-a", input_usd_per_mtok = 1.0, output_usd_per_mtok = 2.0 }}
b = {{ id = "sim-b" }}

[prompts]
data = "{data}"
provider = "sim"
models = ["a", "b"]
n = 2
prompt = "Q{{{{ id }}}}: {{{{ question }}}}"

[prompts.parse]
json_schema = {{ type = "object", properties = {{ answer = {{ type = "string" }} }} }}
"""


def _result(unit: UnitSpec, index: int) -> UnitResult:
    """Every 5th unit failed; every 11th answered without its request key (a record written before it was kept)."""
    if index % 5 == 4:
        return UnitResult(unit_id=unit.unit_id, key=unit.request.key(), error="HTTP 503")
    texts = [json.dumps({"answer": f"x{index}"}), "not json"][: 1 + index % 2]
    response = ProviderResponse(texts=texts, input_tokens=10 + index, output_tokens=3, finish_reasons=["stop"] * 2)
    return UnitResult(unit_id=unit.unit_id, key="" if index % 11 == 0 else unit.request.key(), response=response)


def test_a_multi_shard_reduce_writes_what_one_piece_would(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    with data.open("w") as f:
        for i in range(ROWS):
            f.write(
                json.dumps({"id": f"q{i:03d}", "question": f"what is {i}?", "level": i % 4, "tags": ["t"] * (i % 3)})
            )
            f.write("\n")
    (tmp_path / "c.toml").write_text(CONFIG.format(data=data))
    cfg = load_config(tmp_path / "c.toml")
    ctx = StageContext(cfg, "r", LocalStore(str(tmp_path / "store")))
    stage = GenerateStage()
    units = list(stage.plan(ctx))
    results = [_result(u, i) for i, u in enumerate(units)]
    shards = [results[i : i + SHARD] for i in range(0, len(results), SHARD)]
    loads: list[int] = []

    def load(index: int) -> ShardOutput:
        loads.append(index)
        return ShardOutput(stage="generate", shard=index, results=shards[index])

    streamed = ShardResults(load, [s[0].unit_id for s in shards], len(units), keep_shards=2)
    assert stage.reduce(ctx, streamed) == ["outputs.jsonl", "outputs.parquet"]
    assert sorted(set(loads)) == list(range(len(shards)))  # every shard read; only 2 kept at a time

    jsonl = (tmp_path / "store" / "r" / "artifacts" / "outputs.jsonl").read_bytes()
    rows = list(read_jsonl(jsonl))
    assert len(rows) == ROWS * 2 * 2
    planned = {u.unit_id: u.request.key() for u in units}
    by_unit = dict(zip([u.unit_id for u in units], results, strict=True))
    for i, row in enumerate(rows):
        unit_id = units[i // 2].unit_id
        assert row.request_key == planned[unit_id]  # a result without its key gets its planned request's
        result = by_unit[unit_id]
        texts = result.response.texts if result.response is not None else []
        assert row.text == (texts[i % 2] if i % 2 < len(texts) else None)
        assert (row.error is None) == (row.text is not None)

    # the same reduce from every result in memory writes the same bytes
    ctx_whole = StageContext(cfg, "w", LocalStore(str(tmp_path / "store")))
    stage.reduce(ctx_whole, {r.unit_id: r for r in results})
    whole = tmp_path / "store" / "w" / "artifacts"
    assert (whole / "outputs.jsonl").read_bytes() == jsonl
    parquet = (tmp_path / "store" / "r" / "artifacts" / "outputs.parquet").read_bytes()
    assert (whole / "outputs.parquet").read_bytes() == parquet

    # Parquet in row groups of 10 holds what one table of every row holds
    layout = Job(cfg).layout()
    fields = {r.id: r.fields for r in Job(cfg).rows}
    pairs = [(r, fields[r.row_id]) for r in rows]
    grouped = pq.ParquetFile(io.BytesIO(b"".join(parquet_chunks(pairs, layout, row_group=10))))
    assert grouped.metadata.num_row_groups == (len(pairs) + 9) // 10
    one_piece = layout.table(pairs)
    assert grouped.read().equals(one_piece)
    assert pq.read_table(io.BytesIO(parquet)).equals(one_piece)
    assert msgspec.json.decode(jsonl.splitlines()[0])["level"] == 0  # input columns first, under their names
    assert isinstance(rows[0], OutputRow)


def test_a_row_group_built_in_slices_is_the_bytes_of_one_built_whole(tmp_path: Path) -> None:
    """A row group's Arrow columns are built ``TABLE_SLICE`` rows at a time (its rows' Python objects are several
    times their columns' size); the file is the one a row group built in one piece gives, byte for byte."""
    data = tmp_path / "rows.jsonl"
    rows_total = 2 * TABLE_SLICE + 300  # three slices, the last one short
    with data.open("w") as f:
        for i in range(rows_total):
            f.write(json.dumps({"id": f"q{i:05d}", "question": f"what is {i}?", "level": i % 4}) + "\n")
    (tmp_path / "c.toml").write_text(CONFIG.format(data=data))
    cfg = load_config(tmp_path / "c.toml")
    job = Job(cfg)
    layout = job.layout()
    pairs = [
        (OutputRow(row_id=r.id, model="a", sample=0, text=f"answer {i}" * (i % 7), input_tokens=i), r.fields)
        for i, r in enumerate(job.rows)
    ]
    sliced = b"".join(parquet_chunks(pairs, layout, row_group=len(pairs)))
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, layout.schema, compression="zstd") as writer:
        writer.write_table(layout.table(pairs))
    assert sliced == sink.getvalue()
    assert pq.ParquetFile(io.BytesIO(sliced)).metadata.num_row_groups == 1


def test_a_stage_s_usage_is_summed_once_per_shard_in_shard_order_whatever_the_reads() -> None:
    """``ShardResults.usage`` keeps no usage per shard once summed: shards read out of order, twice (evicted and
    read again) or never before ``usage`` give the sum of one pass in shard order, to the last bit."""
    costs = [0.1, 0.2, 0.3, 1e-17, 0.7, 1e16, 0.05]
    shards = []
    for index, cost in enumerate(costs):
        usage = ShardUsage(units_ok=index + 1)
        usage.add_call("m", 10, 1, cost)
        unit = UnitResult(unit_id=f"u{index}", key="")
        shards.append(ShardOutput(stage="s", shard=index, results=[unit], usage=usage))
    expected = ShardUsage()
    for s in shards:
        assert s.usage is not None
        expected.add(s.usage)
    results = ShardResults(lambda i: shards[i], [f"u{i}" for i in range(len(shards))], len(shards), keep_shards=1)
    for unit_id in ("u3", "u1", "u3", "u0", "u5"):  # out of order, u3 read twice (evicted between)
        assert results[unit_id].unit_id == unit_id
    assert results.usage() == expected
    assert results.usage().models["m"].cost_usd == expected.models["m"].cost_usd


def test_a_jsonl_read_in_pieces_gives_the_rows_of_the_whole() -> None:
    """``read_jsonl_chunks`` (the judge's answers, the run's summary: a 10^6-row file is not held) cuts pieces at any
    byte, a line across two or three pieces, a last line without its newline."""
    rows = [OutputRow(row_id=f"r{i}", model="m", sample=0, text="é\r" * (i % 5) or None) for i in range(40)]
    raw = b"".join(jsonl_chunks((r, {}) for r in rows)) + b"\n"
    raw = raw[:-2]  # no newline after the last line
    whole = list(read_jsonl(raw))
    assert whole == rows
    for size in (1, 7, 64, len(raw)):
        assert list(read_jsonl_chunks(raw[i : i + size] for i in range(0, len(raw), size))) == whole
