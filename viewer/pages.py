"""The viewer's HTML: server-rendered pages with a few lines of script (a running run's table refreshes itself).

Every value is escaped here; what reaches these functions is already redacted (see ``queries``).
"""

from __future__ import annotations

import contextlib
import time
from urllib.parse import quote, urlencode

import msgspec

from punchline.cluster.records.runs import RunRow
from punchline.cluster.records.status import StatusView
from punchline.viewer.artifacts import esc
from punchline.viewer.queries import ModelRow, SamplesPage, StageRow, UnitView

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}
header{background:#24292f;color:#fff;padding:8px 16px}header a{color:#fff;margin-right:16px}
main{padding:12px 16px}table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top;max-width:520px}
th{background:#f3f3f3}.bad{color:#b00}.ok{color:#070}.muted{color:#777}
pre{white-space:pre-wrap;margin:0;max-height:260px;overflow:auto}img.plot{max-width:900px;border:1px solid #ddd}
.bar{background:#eee;width:160px;height:10px;display:inline-block}.bar i{background:#2a7;height:10px;display:block}
form.filters label{margin-right:10px}.pair{display:flex;gap:12px}.pair>div{flex:1;min-width:0}
.unit{border:1px solid #ddd;margin:8px 0;padding:6px}.role{font-weight:bold;color:#555}
img.thumb{max-height:220px;margin:4px;border:1px solid #ddd}
tr.reference th,tr.reference td{background:#eef7ee}
"""

LIVE_JS = """
(function(){const box=document.getElementById('stages');const url=box.dataset.live;
const tick=async()=>{try{const r=await fetch(url);const j=await r.json();box.innerHTML=j.html;
document.getElementById('log').innerHTML=j.log;
document.getElementById('state').textContent=j.state;if(j.state==='running'){setTimeout(tick,1000)}else{location.reload()}}
catch(e){setTimeout(tick,2000)}};setTimeout(tick,1000)})();
"""


def layout(title: str, body: str, script: str = "") -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)} - punchline view</title>"
        f"<style>{CSS}</style></head><body><header><a href='/'>punchline view</a><span>{esc(title)}</span></header>"
        f"<main>{body}</main>{f'<script>{script}</script>' if script else ''}</body></html>"
    )


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + " UTC" if ts else ""


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class RunDetails(msgspec.Struct, kw_only=True):
    """What the runs page adds to a ``runs`` row, from the run's record (live counters while it runs)."""

    stages: list[str] = []
    units_failed: int = 0
    calls: int = 0
    finished_at: float | None = None


RELOAD_JS = "setTimeout(() => location.reload(), 2000);"


def runs_page(rows: list[RunRow], extra: list[str], details: dict[str, RunDetails] | None = None) -> str:
    details = details or {}
    body = "<h1>Runs</h1><table id='runs'><thead><tr><th>run</th><th>pipeline</th><th>state</th><th>stages</th>"
    body += "<th>units done</th><th>failed</th><th>calls</th><th>cost</th><th>started</th><th>finished</th>"
    body += "</tr></thead><tbody>"
    for r in rows:
        d = details.get(r.run_id, RunDetails())
        link = f"<a href='/run/{quote(r.run_id)}'>{esc(r.run_id)}</a>"
        state = esc(r.error) if r.error else esc(r.state)
        body += f"<tr><td>{link}</td><td>{esc(r.pipeline)}</td><td class='state'>{state}</td>"
        body += f"<td>{esc(', '.join(d.stages))}</td><td>{r.units_done}</td><td>{d.units_failed}</td><td>{d.calls}</td>"
        body += f"<td>${r.cost_usd:.4f}</td><td>{esc(r.created)}</td><td>{_when(d.finished_at)}</td></tr>"
    body += "</tbody></table>"
    body += "".join(f"<p><a href='/run/{quote(x)}'>{esc(x)}</a> (from the store)</p>" for x in extra)
    return layout("runs", body, RELOAD_JS if any(r.state == "running" for r in rows) else "")


def stages_table(run_id: str, rows: list[StageRow]) -> str:
    out = "<table id='stage-table'><thead><tr><th>stage</th><th>progress</th><th>units</th><th>failed</th>"
    out += "<th>shards</th><th>in flight</th><th>calls</th><th>cache hits</th><th>retries</th><th>rate</th><th>ETA</th>"
    out += "<th>cost</th><th></th></tr></thead><tbody>"
    for r in rows:
        frac = (r.units_done + r.units_failed) / r.units_total if r.units_total else 0.0
        bar = f"<span class='bar'><i style='width:{min(100, frac * 100):.0f}%'></i></span> {frac * 100:.0f}%"
        rate = f"{r.rate_per_s:.1f}/s" if r.rate_per_s else ""
        samples = f"<a href='/run/{quote(run_id)}/samples?{urlencode({'stage': r.stage})}'>samples</a>"
        out += (
            f"<tr data-stage='{esc(r.stage)}'><td>{esc(r.stage)}</td><td>{bar}</td>"
            f"<td class='done'>{r.units_done}/{r.units_total}</td><td class='{'bad' if r.units_failed else ''}'>"
            f"{r.units_failed}</td><td>{r.shards_done}/{r.shards_total}</td>"
            f"<td>{'' if r.leased is None else r.leased}</td>"
            f"<td>{r.calls}</td><td>{r.cache_hits}</td><td>{r.retries}</td><td>{rate}</td><td>{_dur(r.eta_s)}</td>"
            f"<td>${r.cost_usd:.4f}</td><td>{samples}</td></tr>"
        )
    return out + "</tbody></table>"


def run_page(
    view: StatusView,
    rows: list[StageRow],
    created: float,
    finished: float | None,
    artifacts: list[str],
    config: str,
    recent: list[dict[str, str]],
    results: str = "",
) -> str:
    rid = quote(view.run_id)
    body = (
        f"<h1>{esc(view.run_id)}</h1><p>pipeline <b>{esc(view.pipeline)}</b>, state <b id='state'>{esc(view.state)}</b>"
    )
    body += f"{' (live)' if view.live else ''}; started {_when(created)}"
    body += f"{'; finished ' + _when(finished) if finished else ''}; <a href='/run/{rid}/metrics'>metrics</a>; "
    body += f"<a id='models-link' href='/run/{rid}/models'>latency and retries per model</a></p>"
    live = f"/run/{rid}/live"
    body += f"<h2>Stages</h2><div id='stages' data-live='{live}'>{stages_table(view.run_id, rows)}</div>"
    body += "<h2>Cost per model</h2><table id='usage'><tr><th>stage</th><th>model</th><th>input tokens</th>"
    body += "<th>output tokens</th><th>cost</th></tr>"
    for u in view.usage:
        body += f"<tr><td>{esc(u.stage)}</td><td>{esc(u.model)}</td><td>{u.input_tokens}</td><td>{u.output_tokens}</td>"
        body += f"<td>${u.usd:.4f}</td></tr>"
    body += "</table>"
    failing = [r for r in rows if r.failures_total]
    if failing:
        body += "<h2>Failures</h2>"
        for r in failing:
            body += f"<h3>{esc(r.stage)}: {r.failures_total} failed</h3><table class='failures'>"
            body += "".join(f"<tr><td>{esc(u)}</td><td>{esc(why)}</td></tr>" for u, why in r.failures) + "</table>"
            failed = urlencode({"stage": r.stage, "failed": "1"})
            body += f"<p><a href='/run/{rid}/samples?{failed}'>all failed units</a></p>"
    if view.batches:
        body += "<h2>Batches</h2><table id='batches'><tr><th>stage</th><th>model</th><th>state</th>"
        body += "<th>provider status (last poll)</th><th>requests</th>"
        body += "<th>succeeded</th><th>failed</th><th>cost</th><th>error</th></tr>"
        for b in view.batches:
            body += f"<tr><td>{esc(b.stage)}</td><td>{esc(b.model)}</td><td>{esc(b.state)}</td>"
            body += f"<td class='provider-status'>{esc(b.provider_status)}</td><td>{b.requests}</td>"
            body += f"<td>{b.succeeded}</td><td>{b.failed}</td><td>${b.cost_usd:.4f}</td><td>{esc(b.error)}</td></tr>"
        body += "</table>"
    if results:
        body += f"<h2>Results</h2><div id='results'>{results}</div>"
    body += "<h2>Artifacts</h2><ul id='artifacts'>"
    for a in artifacts:
        body += f"<li><a href='/run/{rid}/artifact/{quote(a)}'>{esc(a)}</a></li>"
    body += "</ul>" + ("" if artifacts else "<p class='muted'>none yet</p>")
    body += f"<h2>What it did last</h2><div id='log'>{log_table(recent)}</div>"
    body += f"<details><summary>config (secrets masked)</summary><pre id='config'>{esc(config)}</pre></details>"
    return layout(view.run_id, body, LIVE_JS if view.state == "running" else "")


def log_table(recent: list[dict[str, str]]) -> str:
    """The run log's last lines: time, level, event and the rest of the line (already redacted)."""
    if not recent:
        return "<p class='muted'>no log here</p>"
    rows = ""
    for line in recent:
        rest = " ".join(f"{k}={v}" for k, v in line.items() if k not in ("timestamp", "level", "event"))
        cls = "bad" if line.get("level") in ("warning", "error") else ""
        rows += f"<tr class='{cls}'><td>{esc(line.get('timestamp', ''))}</td><td>{esc(line.get('level', ''))}</td>"
        rows += f"<td>{esc(line.get('event', ''))}</td><td>{esc(rest[:300])}</td></tr>"
    last = recent[-1]
    now = f"<p id='now'>latest: <b>{esc(last.get('event', ''))}</b> {esc(last.get('stage', ''))} "
    now += f"<span class='muted'>{esc(last.get('timestamp', ''))}</span></p>"
    return f"{now}<table class='log'>{rows}</table>"


def artifact_page(run_id: str, rel: str, fragment: str) -> str:
    back = f"<p><a href='/run/{quote(run_id)}'>back to {esc(run_id)}</a></p>"
    return layout(f"{run_id}: {rel}", f"{back}<h1>{esc(rel)}</h1><div id='artifact'>{fragment}</div>")


def _unit(u: UnitView | None) -> str:
    if u is None:
        return "<div class='unit muted'>no unit of that model with the same prompt</div>"
    cls = {"done": "ok", "failed": "bad", "unreadable": "bad"}.get(u.state, "muted")
    head = f"<b>{esc(u.unit_id)}</b> <span class='{cls} state'>{esc(u.state)}</span> · {esc(u.alias or u.model)}"
    head += f" · n={u.n} t={u.temperature:g}"
    if u.check:
        head += f" · check {esc(u.check)}"
    head += f" · tokens {u.input_tokens}+{u.output_tokens}"
    if u.cost_usd is not None:
        head += f" · ${u.cost_usd:.6f}"
    if u.latency_s is not None:
        head += f" · <span class='latency'>{u.latency_s:.2f} s</span>"
    elif u.state == "done":
        head += " · <span class='latency muted'>no call (cached)</span>"
    head += f" · <span class='retries{' bad' if u.retries else ''}'>retries {u.retries}</span>"
    head += f" · shard {u.shard} (its retries {u.shard_retries}, cache hits {u.shard_cache_hits})"
    prompt = "".join(
        f"<div><span class='role'>{esc(role)}</span><pre>{esc(text)}</pre></div>" for role, text in u.messages
    )
    out = f"<div class='unit' data-unit='{esc(u.unit_id)}'><div>{head}</div>"
    out += f"<details><summary>prompt</summary>{prompt}</details>"
    if u.row:
        cells = "".join(
            f"<tr class='{'reference' if ref else ''}'><th>{esc(name)}{' (reference)' if ref else ''}</th>"
            f"<td><pre>{esc(value[:2000])}</pre></td></tr>"
            for name, value, ref in u.row
        )
        out += f"<table class='row-inputs'>{cells}</table>"
    elif u.row_note:
        out += f"<p class='muted row-note'>{esc(u.row_note)}</p>"
    if u.error:
        out += f"<p class='bad error'>{esc(u.error)}</p>"
    if u.texts:
        out += "<table class='samples'><tr><th>#</th><th>answer</th><th>finish</th><th>parsed</th></tr>"
        for i, text in enumerate(u.texts):
            finish = u.finish_reasons[i] if i < len(u.finish_reasons) else ""
            parsed = u.parsed[i] if i < len(u.parsed) else ""
            pcls = "bad" if parsed.startswith("error") else ""
            out += f"<tr><td>{i}</td><td><pre class='answer'>{esc(text)}</pre></td><td>{esc(finish)}</td>"
            out += f"<td class='{pcls}'>{esc(parsed)}</td></tr>"
        out += "</table>"
    if u.score is not None:
        out += f"<p>score: <b class='score'>{esc(u.score)}</b></p>"
    if u.judges:
        out += "<table class='judges'><tr><th>judged by</th><th>score / verdict</th><th>judge's answer</th></tr>"
        for j in u.judges:
            out += f"<tr><td>{esc(j.unit_id)} ({esc(j.model)})</td><td class='score'>{esc(j.score or '')}</td>"
            out += f"<td><pre>{esc(j.error or j.text)}</pre></td></tr>"
        out += "</table>"
    return out + "</div>"


def samples_page(p: SamplesPage) -> str:
    q = p.query
    rid = quote(p.run_id)
    stages = "".join(f"<option{' selected' if s == q.stage else ''}>{esc(s)}</option>" for s in p.stages)

    def models(selected: str, none: str) -> str:
        opts = f"<option value=''>{none}</option>"
        for m in p.models:
            name = p.aliases.get(m)
            label = f"{name} ({m})" if name else m
            opts += f"<option value='{esc(m)}'{' selected' if m == selected else ''}>{esc(label)}</option>"
        return opts

    form = (
        f"<form class='filters' id='filters' method='get' action='/run/{rid}/samples'>"
        f"<label>stage <select name='stage' id='f-stage'>{stages}</select></label>"
        f"<label>model <select name='model' id='f-model'>{models(q.model, '(all)')}</select></label>"
        f"<label>compare with <select name='compare' id='f-compare'>{models(q.compare, '(none)')}</select></label>"
        f"<label><input type='checkbox' name='failed' value='1' id='f-failed'{' checked' if q.failed else ''}>"
        " failed / does not parse</label>"
        f"<label>judge score <input name='score' id='f-score' size='8' value='{esc(q.score)}'></label>"
        f"<label>search <input name='q' id='f-q' value='{esc(q.q)}'></label>"
        f"<label>order <select name='sort' id='f-sort'>{_sort_options(q.sort, p.rows)}</select></label>"
        "<button type='submit' id='f-go'>show</button></form>"
    )
    base = msgspec.structs.asdict(q)
    scanning = q.failed or q.score or q.q
    nav = ""
    if p.total is not None:
        first = q.page * q.size + 1 if p.rows else 0
        nav = f"<span id='shown'>{first}-{q.page * q.size + len(p.rows)} of {p.total}</span> "
        if q.page > 0:
            nav += f"<a id='prev' href='?{urlencode({**base, 'page': q.page - 1})}'>previous</a> "
    else:
        nav = f"<span id='shown'>{len(p.rows)} matches (looked at {p.scanned} units)</span> "
    if p.next_after is not None:
        nxt = {**base, "after": p.next_after} if scanning else {**base, "page": p.next_after}
        nav += f"<a id='next' href='?{urlencode(nxt)}'>next</a>"
    notes = "".join(f"<p class='note bad'>{esc(n)}</p>" for n in p.notes)
    if p.sorted_by:
        notes += f"<p class='muted' id='sorted-by'>{esc(p.sorted_by)}</p>"
    if q.compare:
        rows = "".join(
            f"<div class='pair'><div>{_unit(a)}</div><div>{_unit(b)}</div></div>"
            for a, b in zip(p.rows, p.partners, strict=False)
        )
        heading = f"<div class='pair'><div><h3>{esc(p.aliases.get(q.model, q.model))}</h3></div>"
        heading += f"<div><h3>{esc(p.aliases.get(q.compare, q.compare))}</h3></div></div>"
        rows = f"<div id='compare'>{heading}{rows}</div>"
    else:
        rows = "".join(_unit(u) for u in p.rows)
    back = f"<p><a href='/run/{rid}'>back to {esc(p.run_id)}</a></p>"
    return layout(f"{p.run_id}: samples", f"{back}{form}{notes}<p class='nav'>{nav}</p><div id='rows'>{rows}</div>")


def _sort_options(current: str, rows: list[UnitView]) -> str:
    """Plan order, the judge's score and the parsed value either way, and each parsed field seen on the page."""
    fields: list[str] = []
    for u in rows:
        for parsed in u.parsed[:1]:
            with contextlib.suppress(msgspec.DecodeError):
                value = msgspec.json.decode(parsed)
                if isinstance(value, dict):
                    fields += [str(k) for k in value if str(k) not in fields]
    keys = [("", "plan order"), ("score", "judge's score, ascending"), ("-score", "judge's score, descending")]
    keys += [("parsed", "parsed value, ascending"), ("-parsed", "parsed value, descending")]
    for f in fields[:12]:
        keys += [(f"parsed.{f}", f"parsed {f}, ascending"), (f"-parsed.{f}", f"parsed {f}, descending")]
    if current and all(k != current for k, _ in keys):
        keys.append((current, current))
    return "".join(
        f"<option value='{esc(k)}'{' selected' if k == current else ''}>{esc(label)}</option>" for k, label in keys
    )


def _secs(value: float | None) -> str:
    if value is None:
        return ""
    return "> 300 s" if value == float("inf") else f"≤ {value:g} s"


def models_page(run_id: str, rows: list[ModelRow], live: bool, notes: list[str]) -> str:
    """Per stage and model: calls, retries, 429s and the answered units' latency distribution (from the committed
    shard files), and while the run runs its workers' calls in flight, 429s and retries of the moment."""
    rid = quote(run_id)
    body = f"<p><a href='/run/{rid}'>back to {esc(run_id)}</a></p><h1>Latency and retries per model</h1>"
    body += "".join(f"<p class='note muted'>{esc(n)}</p>" for n in notes)
    body += "<table id='models'><thead><tr><th>stage</th><th>model</th><th>calls</th><th>retries</th><th>429s</th>"
    body += "<th>answered</th><th>mean</th><th>p50</th><th>p90</th><th>p99</th><th>distribution</th>"
    if live:
        body += "<th>in flight now</th><th>429s (live)</th><th>retries (live)</th>"
    body += "</tr></thead><tbody>"
    for r in rows:
        peak = max((n for _, n in r.buckets), default=0)
        dist = "".join(
            f"<div><span class='muted'>{esc(label)}</span> <span class='bar'><i style='width:{n / peak * 100:.0f}%'>"
            f"</i></span> {n}</div>"
            for label, n in r.buckets
        )
        name = f"{r.alias} ({r.model})" if r.alias else r.model
        body += f"<tr data-model='{esc(r.model)}' data-stage='{esc(r.stage)}'>"
        body += f"<td>{esc(r.stage)}</td><td>{esc(name)}</td>"
        body += f"<td>{r.calls}</td><td class='retries'>{r.retries}</td><td class='rate-limited'>{r.rate_limited}</td>"
        body += f"<td>{r.answered}</td><td>{'' if r.mean_s is None else f'{r.mean_s:.2f} s'}</td>"
        body += f"<td class='p50'>{_secs(r.p50_s)}</td><td>{_secs(r.p90_s)}</td><td>{_secs(r.p99_s)}</td>"
        body += f"<td class='dist'>{dist}</td>"
        if live:
            body += f"<td class='in-flight'>{'' if r.in_flight is None else r.in_flight}</td>"
            body += f"<td>{'' if r.live_rate_limited is None else r.live_rate_limited}</td>"
            body += f"<td>{'' if r.live_retries is None else r.live_retries}</td>"
        body += "</tr>"
    body += "</tbody></table>"
    if not rows:
        body += "<p class='muted'>no shard committed yet</p>"
    return layout(f"{run_id}: models", body, RELOAD_JS if live else "")


def error_page(status: int, message: str) -> str:
    return layout(str(status), f"<h1>{status}</h1><p class='bad'>{esc(message)}</p>")
