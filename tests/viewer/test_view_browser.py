"""``punchline view`` in a real browser: headless Chromium (Debian's package) driven by Playwright.

A Humor demo run (two models, a judge stage, plots) is started as a user starts it, with ``--metrics-port``; the
viewer is started on its runs folder; the browser opens the run while it runs and follows it to the end (the page
refreshes itself), opens a plot, then browses the units: filters, pages, compares the two models. The last page
is a screenshot; ``REFRESH_DOCS_SCREENSHOT=1`` copies it to docs/view.png (the README's picture), which a test run
otherwise leaves alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from punchline.viewer.server import ViewServer, ViewSettings

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_view_in_a_browser(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    metrics_port = free_port()
    env = {**os.environ, "HOME": str(tmp_path)}
    log = open(tmp_path / "run.out", "w")  # noqa: SIM115
    # the demo, with every request's first attempt answered 429 (Retry-After 50 ms): the metrics count them
    config = (ROOT / "configs/humor_demo.toml").read_text()
    config = config.replace("../data/samples/", f"{ROOT}/data/samples/")
    config = config.replace(
        "[simulator]\n", "[simulator]\nfail_first_attempts = 1\nfail_status = 429\nfail_retry_after_s = 0.05\n"
    )
    (tmp_path / "humor_demo.toml").write_text(config)
    driver = subprocess.Popen(
        [sys.executable, "-m", "punchline.cluster.cli.main", "run", str(tmp_path / "humor_demo.toml"),
         "--runs-dir", str(runs), "--run-id", "humor-live", "--no-progress", "--metrics-port", str(metrics_port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    server = ViewServer(ViewSettings(runs_dir=str(runs))).start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        deadline = time.monotonic() + 120
        while not (runs / "humor-live" / "run.json").exists():
            assert driver.poll() is None, (tmp_path / "run.out").read_text()
            assert time.monotonic() < deadline, "the run wrote no record"
            time.sleep(0.2)
        scrapes: list[str] = []

        def scrape() -> None:  # the driver's /metrics, as Prometheus would, until the run ends
            while driver.poll() is None:
                with contextlib.suppress(OSError):
                    url = f"http://127.0.0.1:{metrics_port}/metrics"
                    scrapes.append(urllib.request.urlopen(url, timeout=10).read().decode())
                time.sleep(0.3)

        scraper = threading.Thread(target=scrape, daemon=True)
        scraper.start()
        while driver.poll() is None and not any("punchline_stage_calls_total" in text for text in scrapes):
            time.sleep(0.2)
        scraped = next((text for text in scrapes if "punchline_stage_calls_total" in text), "")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/")  # the runs: this one with its stages (the page reloads itself while it runs)
            assert "generate, judge" in page.inner_text("#runs")
            page.click("#runs a[href='/run/humor-live']")
            seen_running = page.inner_text("#state") == "running"
            # the page follows the run by itself until it ends, then reloads with its artifacts
            page.wait_for_function("document.getElementById('state').textContent === 'finished'", timeout=300_000)
            page.wait_for_selector("#artifacts a", timeout=30_000)
            assert driver.wait(timeout=60) == 0
            # the driver served its metrics while it ran
            assert 'state="running",live="true"' in scraped and "punchline_stage_calls_total" in scraped, scraped
            scraper.join(timeout=30)

            # the workers' figures of the moment: calls in flight, the 429s, and the calls' latency, per model
            def most(name: str) -> float:
                found = [float(v) for text in scrapes for v in re.findall(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M)]
                return max(found, default=0.0)

            assert most("punchline_provider_rate_limited_total") >= 1, scrapes[-1]
            assert most("punchline_provider_calls_in_flight") >= 1, scrapes[-1]
            assert most("punchline_provider_call_latency_seconds_count") >= 1, scrapes[-1]
            assert seen_running or "finished" in page.inner_text("#state")
            done = page.inner_text("#stage-table")
            assert "shard_done" in page.inner_text("#log")  # the run log's last lines
            # no silent gap: each stage's plan and reduce say when they start and how long they took
            events = [json.loads(line) for line in (runs / "humor-live" / "log.jsonl").read_text().splitlines()]
            for stage in ("generate", "judge"):
                for name in ("plan_start", "plan_done", "reduce_start", "reduce_done"):
                    assert any(e.get("event") == name and e.get("stage") == stage for e in events), (stage, name)
            assert all(e["seconds"] >= 0 for e in events if e.get("event") in ("plan_done", "reduce_done"))
            assert re.search(r"generate\s+100%\s+48/48", done), done
            # Humor's results on the run's page: each model's scores with their CIs, the judges' disagreements
            assert page.locator("#humor-results tr").count() == 3 and "(0." in page.inner_text("#humor-results")
            # latency and retries per model, from the shard files: the 429s each model's calls met, its distribution
            page.goto(f"{base}/run/humor-live/models")
            limited = page.eval_on_selector_all("#models td.rate-limited", "tds => tds.map(t => Number(t.textContent))")
            assert len(limited) >= 3 and sum(limited) >= 48, limited  # every generate request met one 429 at first
            assert page.locator("#models td.dist div").count() >= 3
            page.goto(f"{base}/run/humor-live")
            # a plot
            page.click("#artifacts a[href$='confusion.png']")
            img = page.wait_for_selector("img.plot")
            assert img is not None and page.evaluate("document.querySelector('img.plot').naturalWidth") > 100
            # Humor's report: scores with CIs and the items where the two judges disagree
            page.goto(f"{base}/run/humor-live/artifact/report/8b/report.json")
            assert "95% CI" in page.inner_text("#humor-ci") and page.is_visible("#disagreements")
            # the units: pages, a model filter, the judge's verdict beside each answer
            page.goto(f"{base}/run/humor-live/samples?stage=generate&size=10")
            assert page.inner_text("#shown").startswith("1-10 of 48")
            first = page.get_attribute(".unit", "data-unit")
            page.click("#next")
            page.wait_for_url(re.compile(r"page=1"))
            assert page.inner_text("#shown").startswith("11-20") and page.get_attribute(".unit", "data-unit") != first
            models = page.eval_on_selector_all("#f-model option", "os => os.map(o => o.value).filter(Boolean)")
            assert len(models) == 2
            page.select_option("#f-model", models[1])
            page.click("#f-go")
            page.wait_for_url(re.compile(r"model="))
            assert page.inner_text("#shown").endswith("of 24")
            assert "judged by" in page.inner_text("#rows")
            # a judge score: the units whose judge said 1
            page.fill("#f-score", "1")
            page.click("#f-go")
            page.wait_for_url(re.compile(r"score=1"))
            judged = page.eval_on_selector_all(
                ".unit", "us => us.map(u => [...u.querySelectorAll('td.score')].map(t => t.textContent))"
            )
            assert judged and all("1" in scores for scores in judged), judged
            page.fill("#f-score", "")
            # a search that scans the answers
            page.fill("#f-q", "ОТВЕТ")
            page.click("#f-go")
            page.wait_for_url(re.compile(r"q="))
            assert page.locator(".unit").count() > 0
            # the two models side by side on the same items
            page.goto(f"{base}/run/humor-live/samples?stage=generate&size=4")
            page.select_option("#f-model", models[0])
            page.select_option("#f-compare", models[1])
            page.click("#f-go")
            page.wait_for_selector("#compare")
            pairs = page.eval_on_selector_all(
                "#compare .pair", "ps => ps.map(p => [...p.querySelectorAll('.unit')].map(u => u.dataset.unit))"
            )
            pairs = [pair for pair in pairs if len(pair) == 2]
            assert len(pairs) == 24  # every item of the first model, each beside the second's answer
            for left, right in pairs:  # generate/<model>/<item>: the same item
                assert left.rsplit("/", 1)[1] == right.rsplit("/", 1)[1] and left != right
            shot = tmp_path / "view.png"
            page.screenshot(path=str(shot), full_page=False)
            browser.close()
        assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 10_000
        if os.environ.get("REFRESH_DOCS_SCREENSHOT") == "1":  # the README's picture, refreshed on purpose only
            shutil.copyfile(shot, ROOT / "docs" / "view.png")
    finally:
        server.close()
        if driver.poll() is None:
            driver.terminate()
            driver.wait(timeout=60)
        log.close()
