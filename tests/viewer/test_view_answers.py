"""The answers of a judged run in ``punchline view``: the results section, each unit's input row with its reference,
its judge, sorting by the judge's score or a parsed value, a search that finds the last row in one request, ``HEAD``,
and a normal run's log without a gone-driver warning.

The run is real (the prompts demo, offline: ``punchline init`` then ``punchline run``), then scaled by
``bench/view.py``'s :func:`scale` to more rows in the store's real format; the server is the real one, over HTTP.
"""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.view import MARKER, real_run, scale
from punchline.cluster.records.runs import load_run_record
from punchline.viewer.queries import RunMeta, Samples, SamplesQuery
from punchline.viewer.server import ViewServer, ViewSettings

pytestmark = pytest.mark.slow  # a real run of the demo first (tens of seconds)

ROWS = 300
RUN = "judged"


class Served:
    def __init__(self, server: ViewServer, runs: Path, real: Path) -> None:
        self.server, self.runs, self.real = server, runs, real

    def ask(self, path: str, method: str = "GET") -> tuple[int, dict[str, str], str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
        conn.request(method, path)
        resp = conn.getresponse()
        body = resp.read().decode("utf-8", "replace")
        conn.close()
        return resp.status, dict(resp.getheaders()), body


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    scratch = tmp_path_factory.mktemp("real")
    real = real_run(scratch)
    runs = tmp_path_factory.mktemp("runs")
    scale(real, runs, RUN, ROWS, 7)  # 7: shards that do not line up with rows, and many of them
    server = ViewServer(ViewSettings(runs_dir=str(runs))).start()
    try:
        yield Served(server, runs, real)
    finally:
        server.close()


def units_on(page: str) -> list[str]:
    return re.findall(r"data-unit='([^']+)'", page)


def first_scores(page: str) -> list[str]:
    """Per unit on the page, its first judge's score."""
    return [re.findall(r"class='score'>([^<]*)<", part)[0] for part in page.split("<div class='unit'")[1:]]


def test_a_normal_run_logs_no_gone_driver(served: Served) -> None:
    """The driver's stop at a stage's end is a stop it asked for: its worker logs it as such, not as a gone
    driver (what the run page showed in red)."""
    events = [json.loads(line) for line in (served.real / "log.jsonl").read_text().splitlines()]
    assert [e for e in events if e["event"] == "driver_gone"] == []
    assert all(e.get("level") not in ("warning", "error") for e in events if "local_worker" in e["event"])
    assert any(e["event"] == "local_worker_done" and e["driver_gone"] is False for e in events)


def test_the_run_page_has_its_pipelines_results(served: Served) -> None:
    status, _, page = served.ask(f"/run/{RUN}")
    assert status == 200
    assert "<h2>Results</h2>" in page and 'id="prompts-results"' in page
    assert "judge: correct" in page  # the per-model table of the prompts pipeline's results hook


def test_head_is_get_without_its_body(served: Served) -> None:
    for path in (f"/run/{RUN}", f"/run/{RUN}/samples?stage=judge", "/", "/no/such/page"):
        status, headers, body = served.ask(path)
        head_status, head_headers, head_body = served.ask(path, "HEAD")
        assert head_status == status and head_body == ""
        assert head_headers["Content-Length"] == headers["Content-Length"] == str(len(body.encode()))
        assert head_headers["Content-Type"] == headers["Content-Type"]


def test_a_unit_shows_its_row_with_the_reference_and_its_judge(served: Served) -> None:
    real_rows = [json.loads(line) for line in (served.real / "artifacts" / "outputs.jsonl").read_text().splitlines()]
    status, _, page = served.ask(f"/run/{RUN}/samples?stage=generate&size=4&page=10")
    assert status == 200
    units = units_on(page)
    assert units[0] == "generate/r000000020/m0000"
    expected = real_rows[20 * 2 * 3]["answer"]  # row 20 repeats the real run's row 20: 2 models x 3 samples a row
    first = page.split("<div class='unit'")[1]
    assert re.search(rf"<th>answer \(reference\)</th><td><pre>{re.escape(expected)}</pre>", first)
    assert "<th>question</th>" in first  # the rest of the row, unmarked
    assert "judge/r000000020/m0000/s0000" in first  # and its judge


def test_sorting_by_the_judges_score_either_way(served: Served) -> None:
    status, _, up = served.ask(f"/run/{RUN}/samples?stage=generate&size=200&sort=score")
    assert status == 200 and "sorted by the judge" in up
    status, _, down = served.ask(f"/run/{RUN}/samples?stage=generate&size=200&sort=-score")
    scores_up, scores_down = first_scores(up), first_scores(down)
    assert scores_up == sorted(scores_up) and scores_down == sorted(scores_down, reverse=True)
    assert scores_up[0] == "correct" and scores_down[0] == "incorrect"  # both verdicts: the order is not trivial
    assert units_on(up)[0] != units_on(down)[0]
    status, _, judged = served.ask(f"/run/{RUN}/samples?stage=judge&size=50&sort=-score")  # the judge's own
    own = re.findall(r"<b class='score'>([^<]*)<", judged)
    assert status == 200 and own == sorted(own, reverse=True) and len(own) == 50


def test_sorting_by_a_parsed_field(served: Served) -> None:
    status, _, page = served.ask(f"/run/{RUN}/samples?stage=generate&size=100&sort=-parsed.confidence")
    assert status == 200
    values = [float(v) for v in re.findall(r"&quot;confidence&quot;:([0-9.]+)", page)]
    assert len(values) > 50 and values == sorted(values, reverse=True)  # one sample a unit
    assert "parsed.confidence" in page  # offered in the order menu


def test_a_search_finds_the_last_row_in_one_request(served: Served) -> None:
    """The server looks through the whole stage, shard by shard, and the page holds the match: no paging."""
    status, _, page = served.ask(f"/run/{RUN}/samples?stage=generate&q={MARKER.upper()}")
    assert status == 200
    assert units_on(page) == [f"generate/r{ROWS - 1:09d}/m0000", f"generate/r{ROWS - 1:09d}/m0001"]
    assert f"looked at {ROWS * 2} units" in page
    status, _, page = served.ask(f"/run/{RUN}/samples?stage=judge&q={MARKER}&size=1")  # the judge's too
    assert units_on(page) == [f"judge/r{ROWS - 1:09d}/m0000/s0000"] and "id='next'" in page
    status, _, page = served.ask(f"/run/{RUN}/samples?stage=generate&q=no-such-word-anywhere")
    assert status == 200 and units_on(page) == [] and "id='next'" not in page


def test_the_judges_of_a_page_come_from_the_kept_index(served: Served) -> None:
    """Once built (the run page starts it), the judge stage's index is kept under runs/_view/, and a page's judges
    are found through it."""
    served.ask(f"/run/{RUN}")
    kept = served.runs / "_view" / RUN / "judge.idx"
    samples = served.server.viewer.samples(RUN)
    samples.files.index("judge")
    assert kept.is_file()
    status, _, page = served.ask(f"/run/{RUN}/samples?stage=generate&size=5&page=30")
    assert status == 200 and page.count("judged by") == 5
    assert "judge/r000000075/m0000/s0000" in page and "judge/r000000077/m0000/s0000" in page  # units 150..154
    last = f"/run/{RUN}/samples?stage=generate&size=2&page={ROWS - 1}"
    status, _, page = served.ask(last)
    assert f"judge/r{ROWS - 1:09d}/m0001/s0000" in page


def test_a_search_through_the_kept_text_and_through_the_store_s_files(served: Served) -> None:
    """A finished stage's search reads its kept text (written once under runs/_view/); a running run's reads its
    files as stored. Both find the last row's word, in any case, and only there."""
    samples = served.server.viewer.samples(RUN)
    layout = samples.files.layout("judge")
    assert layout is not None
    samples.texts.build("judge", layout, samples.sorter.digest("judge"))
    kept = served.runs / "_view" / RUN / "judge.text"
    assert kept.is_file() and MARKER.encode() in kept.read_bytes()
    text = samples.search_text("judge", layout)
    assert text is not None and text.next_holding(MARKER.encode(), 0) == layout.shards_total - 1
    want = [f"judge/r{ROWS - 1:09d}/m0000/s0000", f"judge/r{ROWS - 1:09d}/m0001/s0000"]
    status, _, page = served.ask(f"/run/{RUN}/samples?stage=judge&q=ZanzibarQuokka")
    assert status == 200 and units_on(page) == want

    record = load_run_record(str(served.runs), RUN)
    store = served.server.viewer.run_store(RUN)
    running = Samples(store, RUN, record.stages, RunMeta(record.pipeline, record.config_toml), finished=False)
    found = running.page(SamplesQuery(stage="judge", q="zanzibarQUOKKA"))
    assert [u.unit_id for u in found.rows] == want and found.scanned == ROWS * 2
    assert running.search_text("judge", layout) is None
