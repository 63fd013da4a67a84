"""The viewer's HTTP server: stdlib ``ThreadingHTTPServer``, one thread per request, pages built on demand.

Safe by construction: it binds 127.0.0.1 unless told otherwise, and then only with a token (asked once as
``?token=``, then kept in an HttpOnly cookie); on loopback it answers only requests whose Host is loopback (a
web page elsewhere cannot reach it through DNS rebinding). It serves run pages, never files by path: a run id
must be a run id and an artifact a store key under ``<run>/artifacts/`` (a ``..`` anywhere is a 404), and a
local store's links out of the store are not followed. What it shows is redacted (config, errors), and a file
it cannot read (a corrupt shard, a truncated record) is named on the page while the server goes on.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import msgspec
import structlog

from punchline.cluster.records.metrics import CONTENT_TYPE, LogEvents, RunMetrics, render
from punchline.cluster.records.run_record import check_run_id
from punchline.cluster.records.runs import ledger_client, list_runs, load_run_record
from punchline.cluster.records.status import StatusView, run_status
from punchline.cluster.registry import resolve
from punchline.cluster.result_sections import ResultsView, head_bytes
from punchline.data.errors import InputError, PunchlineError
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.stores import open_store
from punchline.data.stores.local import LocalStore, validate_key
from punchline.data.units import ModelUsage
from punchline.schedulers.keys import NAMESPACE
from punchline.schedulers.server.redis_client import ClientError
from punchline.viewer import artifacts, pages
from punchline.viewer.pipeline_results import RunPipeline, render_sections
from punchline.viewer.queries import RunMeta, Samples, SamplesQuery, model_rows, redacted_config, stage_rows
from punchline.viewer.references import RowInputs, reference_names
from punchline.viewer.usage import RunUsage
from punchline.workers.calls import call_stats
from punchline.workers.calls.call_stats import CallRow
from punchline.workers.logs import redact_text

log = structlog.get_logger("punchline.view")

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
MAX_RAW_BYTES = 256 << 20
VIEW_CACHE = "_view"  # under the runs folder, beside _ledger/ and _ray/


class ViewSettings(msgspec.Struct, kw_only=True):
    runs_dir: str
    store: str | None = None
    run_id: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None  # required when host is not loopback


class NotFound(Exception):
    pass


class Response(msgspec.Struct, kw_only=True):
    status: int = 200
    content_type: str = "text/html; charset=utf-8"
    body: bytes = b""
    headers: dict[str, str] = {}


class Viewer:
    """What the request threads share: the settings, open stores, and per run its samples reader."""

    def __init__(self, settings: ViewSettings) -> None:
        self.settings = settings
        self._stores: dict[str, Store] = {}
        self._samples: OrderedDict[str, Samples] = OrderedDict()
        self._events: dict[str, LogEvents] = {}
        self._usage: OrderedDict[str, RunUsage] = OrderedDict()  # run -> its usage per stage and model
        self._indexing: set[str] = set()
        self._lock = threading.Lock()

    # --- reading a run ----------------------------------------------------------------------------------

    def store(self, url: str) -> Store:
        with self._lock:
            if url not in self._stores:
                self._stores[url] = open_store(url)
            return self._stores[url]

    def _run_id(self, raw: str) -> str:
        try:
            return check_run_id(raw, field="run")
        except PunchlineError:
            raise NotFound(f"no run {raw[:60]!r}") from None

    def status(self, run_id: str) -> StatusView:
        return run_status(self.settings.runs_dir, run_id, self.settings.store)

    def run_store(self, run_id: str) -> Store:
        record = load_run_record(self.settings.runs_dir, run_id, self.settings.store)
        return self.store(self.settings.store or record.services.store_url)

    def samples(self, run_id: str) -> Samples:
        with self._lock:
            have = self._samples.get(run_id)
            if have is not None:
                self._samples.move_to_end(run_id)
                return have
        record = load_run_record(self.settings.runs_dir, run_id, self.settings.store)
        meta = RunMeta(record.pipeline, record.config_toml)
        cache = Path(self.settings.runs_dir) / VIEW_CACHE / run_id  # the stage indexes, kept for the next start
        store = self.run_store(run_id)
        finished = record.state != "running"
        rows = RowInputs(store, run_id, cache, reference_names(record.config_toml)) if finished else None
        made = Samples(store, run_id, record.stages, meta, cache_dir=cache, finished=finished, rows=rows)
        with self._lock:
            self._samples[run_id] = made
            while len(self._samples) > 8:
                self._samples.popitem(last=False)
        return made

    def metrics(self, run_ids: list[str], per_model_calls: bool) -> str:
        runs = []
        for run_id in run_ids:
            try:
                view = self.status(run_id)
            except PunchlineError:
                continue
            with self._lock:
                events = self._events.setdefault(run_id, LogEvents(RunLayout(run_id).local(self.settings.runs_dir).log))
            runs.append(
                RunMetrics(
                    run_id=run_id,
                    pipeline=view.pipeline,
                    state=view.state,
                    live=view.live,
                    counters=view.counters,
                    usage=view.usage,
                    leased=view.leased,
                    batches=view.batches,
                    models=self.model_calls(run_id, list(view.counters)) if per_model_calls else {},
                    events=events.read(),
                    calls=(self.live_calls(run_id) or []) if view.live else [],
                )
            )
        return render(runs)

    def live_calls(self, run_id: str) -> list[CallRow] | None:
        """A running run's workers' figures of the moment (calls in flight, 429s), None when its ledger is out of
        reach (or it does not run)."""
        try:
            record = load_run_record(self.settings.runs_dir, run_id, self.settings.store)
            if record.state != "running":
                return None
            return call_stats.read(ledger_client(record), NAMESPACE, run_id)
        except (PunchlineError, ClientError, OSError):
            return None

    def models_page(self, run_id: str) -> Response:
        record = load_run_record(self.settings.runs_dir, run_id, self.settings.store)
        live = self.live_calls(run_id) if record.state == "running" else None
        meta = RunMeta(record.pipeline, record.config_toml)
        read = self.run_usage(run_id).read(record.stages)
        rows = model_rows(read.models, meta.aliases, live)
        notes = ["from the committed shards (a shard counts once its file is written)", *read.notes]
        if record.state == "running" and live is None:
            notes.append("the run's ledger is out of reach: no figures of the moment")
        return Response(body=pages.models_page(run_id, rows, live is not None, notes).encode())

    def model_calls(self, run_id: str, stages: list[str]) -> dict[str, dict[str, ModelUsage]]:
        """Calls and usage per stage and model, whole (``/metrics``: a counter never shows a partial sum)."""
        return self.run_usage(run_id).read(stages, whole=True).models

    def run_usage(self, run_id: str) -> RunUsage:
        """The run's usage reader (stage manifests first, shard files only where a stage has no sum yet)."""
        with self._lock:
            have = self._usage.get(run_id)
            if have is not None:
                self._usage.move_to_end(run_id)
                return have
        made = RunUsage(self.run_store(run_id), run_id, cache_dir=Path(self.settings.runs_dir) / VIEW_CACHE / run_id)
        with self._lock:
            have = self._usage.setdefault(run_id, made)
            while len(self._usage) > 8:
                self._usage.popitem(last=False)
        return have

    def warm(self) -> None:
        """Import the pipelines of the folder's runs now, beside the first request rather than in it: a pipeline's
        modules (its parsers, templates, the engine's config) take a second or more to import on a busy machine,
        and every run page and answers page asks its pipeline."""
        try:
            names = {r.pipeline for r in list_runs(self.settings.runs_dir) if r.error is None}
            for name in sorted(names)[:8]:
                with contextlib.suppress(Exception):  # the page that needs it says why
                    resolve(name)
        except Exception as exc:  # a warm-up only
            log.info("view_warm_failed", error=str(exc)[:200])

    # --- routes -------------------------------------------------------------------------------------------

    def handle(self, path: str, query: dict[str, str]) -> Response:
        parts = [unquote(p) for p in path.split("/")[1:]]
        if any(p in ("..", ".") or "/" in p or "\\" in p or "\x00" in p for p in parts):
            raise NotFound("no such page")
        if parts in ([""], []):
            return self.runs_page()
        if parts == ["metrics"]:
            ids = self.run_ids()
            return Response(content_type=CONTENT_TYPE, body=self.metrics(ids, per_model_calls=False).encode())
        if len(parts) >= 2 and parts[0] == "run":
            run_id = self._run_id(parts[1])
            rest = parts[2:]
            if rest in ([], [""]):
                return self.run_page(run_id)
            if rest == ["live"]:
                view = self.status(run_id)
                body = {
                    "state": view.state,
                    "html": pages.stages_table(run_id, stage_rows(view)),
                    "log": pages.log_table(self.recent_log(run_id)),
                }
                return Response(content_type="application/json", body=msgspec.json.encode(body))
            if rest == ["metrics"]:
                return Response(content_type=CONTENT_TYPE, body=self.metrics([run_id], per_model_calls=True).encode())
            if rest == ["models"]:
                return self.models_page(run_id)
            if rest == ["samples"]:
                return self.samples_page(run_id, query)
            if len(rest) >= 2 and rest[0] in ("artifact", "raw"):
                rel = "/".join(rest[1:])
                try:
                    validate_key(rel)
                except PunchlineError:
                    raise NotFound("no such artifact") from None
                return self.artifact(run_id, rel, raw=rest[0] == "raw")
        raise NotFound("no such page")

    def run_ids(self) -> list[str]:
        ids = [r.run_id for r in list_runs(self.settings.runs_dir) if r.error is None]
        if self.settings.run_id and self.settings.run_id not in ids:
            ids.append(self.settings.run_id)
        return ids

    def runs_page(self) -> Response:
        rows = list_runs(self.settings.runs_dir)
        extra = (
            [self.settings.run_id]
            if self.settings.run_id and all(r.run_id != self.settings.run_id for r in rows)
            else []
        )
        details: dict[str, pages.RunDetails] = {}
        for row in rows:
            if row.error is not None:
                continue
            try:
                record = load_run_record(self.settings.runs_dir, row.run_id)
                counters = self.status(row.run_id).counters if record.state == "running" else record.counters
            except PunchlineError:
                continue
            details[row.run_id] = pages.RunDetails(
                stages=record.stages,
                units_failed=sum(c.units_failed for c in counters.values()),
                calls=sum(c.provider_requests for c in counters.values()),
                finished_at=record.finished_at,
            )
            if record.state == "running":
                row.units_done = sum(c.units_done for c in counters.values())
                row.cost_usd = sum(c.cost_usd for c in counters.values())
        return Response(body=pages.runs_page(rows, extra, details).encode())

    def run_page(self, run_id: str) -> Response:
        record = load_run_record(self.settings.runs_dir, run_id, self.settings.store)
        view = self.status(run_id)
        store = self.run_store(run_id)
        prefix = RunLayout(run_id).artifacts
        found = [k.removeprefix(prefix) for k in store.list(prefix)]
        config = redacted_config(record.config_toml)
        recent = self.recent_log(run_id)
        link = f"/run/{run_id}/artifact/"
        pipeline = RunPipeline(record.pipeline, record.config_toml)
        own, note = pipeline.sections(ResultsView(store, run_id, found), "results")
        shown = render_sections(own, link, note) + artifacts.plots(found, link)
        body = pages.run_page(
            view, stage_rows(view), record.created_at, record.finished_at, found, config, recent, shown
        )
        self.prepare(run_id, record.stages)
        return Response(body=body.encode())

    def recent_log(self, run_id: str, lines: int = 12) -> list[dict[str, str]]:
        """The last lines of the run's log (this machine's runs folder, else a local store's copy), redacted;
        only its tail is read, however long the log."""
        out: list[dict[str, str]] = []
        for path in (RunLayout(run_id).local(self.settings.runs_dir).log, self._store_log(run_id)):
            if path is None or not path.is_file():
                continue
            try:
                with open(path, "rb") as fh:
                    start = max(0, fh.seek(0, os.SEEK_END) - 32_768)
                    fh.seek(start)
                    tail = fh.read().splitlines()[1 if start else 0 :]  # from a line's start
            except OSError:
                continue
            for raw in tail[-lines:]:
                try:
                    value = msgspec.json.decode(raw)
                except msgspec.DecodeError:
                    continue
                if isinstance(value, dict):
                    out.append({str(k): redact_text(str(v)) for k, v in value.items() if k not in ("pid", "host")})
            return out
        return out

    def _store_log(self, run_id: str) -> Path | None:
        store = self.store(self.settings.store) if self.settings.store else None
        return store.root / RunLayout(run_id).log if isinstance(store, LocalStore) else None

    def prepare(self, run_id: str, stages: list[str]) -> None:
        """Build the run's stage indexes in the background, so that its units page, the next click, finds
        them ready (a million units: a pass over the plan of a few seconds on a busy machine)."""
        with self._lock:
            if run_id in self._indexing:
                return
            self._indexing.add(run_id)

        def build() -> None:
            try:
                files = self.samples(run_id).files
                for stage in stages:
                    files.index(stage)
                samples = self.samples(run_id)
                for stage in stages:  # then a finished stage's searchable text (search_text.py)
                    layout = files.layout(stage)
                    if layout is not None and samples.sorter.keep:
                        samples.texts.ready(stage, layout, samples.sorter.digest(stage))
                for stage in stages:  # then what comparing two models needs
                    index = files.index(stage)
                    if index is not None and len(index.models) > 1:
                        index.prompts(files.store.get)
            except Exception as exc:  # the page that needs it says why
                log.info("view_index_failed", run_id=run_id, error=str(exc)[:200])
            finally:
                with self._lock:
                    self._indexing.discard(run_id)

        threading.Thread(target=build, name=f"punchline-view-index-{run_id}", daemon=True).start()

    def samples_page(self, run_id: str, query: dict[str, str]) -> Response:
        def num(name: str) -> int:
            try:
                return max(0, int(query.get(name, "0") or 0))
            except ValueError:
                return 0

        q = SamplesQuery(
            stage=query.get("stage", ""),
            model=query.get("model", ""),
            compare=query.get("compare", ""),
            failed=query.get("failed", "") in ("1", "true", "on", "True"),
            score=query.get("score", "").strip(),
            q=query.get("q", "").strip(),
            page=num("page"),
            after=num("after"),
            size=num("size") or 25,
            sort=query.get("sort", "").strip(),
        )
        body = pages.samples_page(self.samples(run_id).page(q)).encode()
        self.prepare(run_id, self.samples(run_id).stages)  # the indexes and searchable texts, for the next click
        return Response(body=body)

    def artifact(self, run_id: str, rel: str, *, raw: bool) -> Response:
        store = self.run_store(run_id)
        key = RunLayout(run_id).artifact(rel)
        if raw:
            data, more = head_bytes(store, key, MAX_RAW_BYTES)
            if data is None:
                raise NotFound("no such artifact")
            if more:
                return Response(status=413, body=pages.error_page(413, "too large to serve").encode())
            # an artifact is data, never a page of this site: an SVG's script does not run
            sandbox = "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; sandbox"
            return Response(
                content_type=artifacts.content_type(rel), body=data, headers={"Content-Security-Policy": sandbox}
            )
        found, _ = head_bytes(store, key, 0)
        if found is None:
            raise NotFound("no such artifact")
        record = load_run_record(self.settings.runs_dir, run_id, self.settings.store)
        prefix = RunLayout(run_id).artifacts
        view = ResultsView(store, run_id, [k.removeprefix(prefix) for k in store.list(prefix)])
        own, note = RunPipeline(record.pipeline, record.config_toml).sections(view, "artifact_results", rel)
        extra = render_sections(own, f"/run/{run_id}/artifact/", note, level=2)
        fragment = artifacts.render(store, run_id, rel, f"/run/{run_id}/raw/{rel}", extra)
        return Response(body=pages.artifact_page(run_id, rel, fragment).encode())


def _page(viewer: Viewer, path: str, query: dict[str, str]) -> Response:
    """The viewer's answer to a path, or an error page saying what went wrong in one line."""
    try:
        return viewer.handle(path, query)
    except NotFound as exc:
        return Response(status=404, body=pages.error_page(404, str(exc)).encode())
    except InputError as exc:
        status = 404 if "no run" in str(exc) else 500
        return Response(status=status, body=pages.error_page(status, str(exc)).encode())
    except Exception as exc:  # a bug or an unreadable file: one line on the page, the server goes on
        log.warning("view_error", path=path, error=f"{type(exc).__name__}: {exc}"[:300])
        message = f"{type(exc).__name__}: {str(exc)[:300]}"
        return Response(status=500, body=pages.error_page(500, message).encode())


def _handler(viewer: Viewer, token: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "punchline-view"
        sys_version = ""

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            """What GET answers (status and headers, its Content-Length included), without the body."""
            self._answer(body=False)

        def _answer(self, *, body: bool) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            extra: dict[str, str] = {}
            if not self._host_ok():
                self._send(Response(status=403, body=pages.error_page(403, "unexpected Host header").encode()), body)
                return
            if token is not None:
                given = query.pop("token", None) or self._cookie("punchline_view")
                if given is None or not hmac.compare_digest(given.encode(), token.encode()):
                    denied = pages.error_page(403, "a token is needed (?token=...)").encode()
                    self._send(Response(status=403, body=denied), body)
                    return
                extra["Set-Cookie"] = f"punchline_view={token}; HttpOnly; SameSite=Strict; Path=/"
            response = _page(viewer, url.path, query)
            response.headers.update(extra)
            self._send(response, body)

        def _host_ok(self) -> bool:
            if token is not None:
                return True
            host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]")
            return host in LOOPBACK

        def _cookie(self, name: str) -> str | None:
            for part in (self.headers.get("Cookie") or "").split(";"):
                k, _, v = part.strip().partition("=")
                if k == name:
                    return v
            return None

        def _send(self, r: Response, body: bool = True) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.send_response(r.status)
                self.send_header("Content-Type", r.content_type)
                self.send_header("Content-Length", str(len(r.body)))
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("Referrer-Policy", "no-referrer")
                self.send_header("X-Frame-Options", "DENY")
                for k, v in r.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if body:
                    self.wfile.write(r.body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


class ViewServer:
    """The viewer on ``host:port`` (port 0: a free one), serving in a background thread until :meth:`close`."""

    def __init__(self, settings: ViewSettings) -> None:
        if settings.host not in LOOPBACK and not settings.token:
            raise InputError("binding beyond 127.0.0.1 needs a token", field="--host")
        self.viewer = Viewer(settings)
        self.settings = settings
        handler = _handler(self.viewer, settings.token if settings.host not in LOOPBACK else None)
        try:
            self.httpd = ThreadingHTTPServer((settings.host, settings.port), handler)
        except OSError as exc:
            raise InputError(f"cannot listen there: {exc.strerror}", field="--port") from None
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.1,), name="punchline-view", daemon=True)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.settings.host in LOOPBACK else self.settings.host
        path = f"/run/{self.settings.run_id}" if self.settings.run_id else "/"
        token = f"?token={self.settings.token}" if self.settings.host not in LOOPBACK and self.settings.token else ""
        return f"http://{host}:{self.port}{path}{token}"

    def start(self) -> ViewServer:
        self.thread.start()
        threading.Thread(target=self.viewer.warm, name="punchline-view-warm", daemon=True).start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def serve_until_interrupted(self) -> None:
        self.start()
        try:
            while self.thread.is_alive():
                time.sleep(0.5)
        finally:
            self.close()


def new_token() -> str:
    return secrets.token_urlsafe(24)
