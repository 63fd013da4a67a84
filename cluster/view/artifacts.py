"""A run's artifacts as HTML: JSON and JSON-lines as tables, markdown's tables, plots as images.

Large artifacts are never read whole: a JSON-lines file shows its first rows (a local store reads just their
bytes), and a JSON file over ``MAX_JSON_BYTES`` is offered as a download. Humor's per-model report gets the
items where its two judges disagree; Puns' ranked list and cloze report are tables like any other.
"""

from __future__ import annotations

import html
import json
import os
from typing import Any

from punchline.data.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.stores.local import LocalStore, validate_key

MAX_JSON_BYTES = 20 << 20
HEAD_ROWS = 200
IMAGE_TYPES = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
TEXT_TYPES = {".json": "application/json", ".jsonl": "application/x-ndjson", ".md": "text/plain", ".txt": "text/plain"}


def content_type(key: str) -> str:
    ext = os.path.splitext(key)[1].lower()
    return IMAGE_TYPES.get(ext) or TEXT_TYPES.get(ext) or "application/octet-stream"


def head_bytes(store: Store, key: str, limit: int) -> tuple[bytes | None, bool]:
    """The first ``limit`` bytes of ``key`` and whether there is more (a local file is not read past them)."""
    if isinstance(store, LocalStore):
        path = (store.root / validate_key(key)).resolve()
        if not path.is_relative_to(store.root.resolve()):  # a link out of the store is not followed
            return None, False
        try:
            with open(path, "rb") as fh:
                head = fh.read(limit + 1)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None, False
        return head[:limit], len(head) > limit
    data = store.get(key)
    return (None, False) if data is None else (data[:limit], len(data) > limit)


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=False)
        return esc(text if len(text) <= 300 else text[:297] + "...")
    return esc(value)


def table(rows: list[dict[str, Any]], cls: str = "data") -> str:
    cols: list[str] = []
    for row in rows:
        cols += [c for c in row if c not in cols]
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(c, ''))}</td>" for c in cols) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _mapping(value: dict[str, Any], depth: int = 0) -> str:
    """A dict: scalars as one key/value table; a dict of dicts as a table with a row per key; deeper as JSON."""
    scalars = {k: v for k, v in value.items() if not isinstance(v, (dict, list))}
    parts = []
    if scalars:
        parts.append(table([{"key": k, "value": v} for k, v in scalars.items()]))
    for k, v in value.items():
        if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()) and depth < 2:
            rows = [{"": name, **{c: x for c, x in inner.items()}} for name, inner in v.items()]
            parts.append(f"<h3>{esc(k)}</h3>" + table(rows))
        elif isinstance(v, dict) and depth < 2:
            parts.append(f"<h3>{esc(k)}</h3>" + _mapping(v, depth + 1))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            parts.append(f"<h3>{esc(k)}</h3>" + table(v[:HEAD_ROWS]))
        elif isinstance(v, (dict, list)):
            parts.append(f"<h3>{esc(k)}</h3><pre>{cell(v)}</pre>")
    return "".join(parts)


def humor_disagreements(report: dict[str, Any]) -> str:
    """The items where Humor's readings disagree: our judge vs MERA's judge, with the model's answer."""
    ours, mera = report.get("judge_scores"), report.get("judge_mera_scores")
    if not isinstance(ours, dict) or not isinstance(mera, dict):
        return ""
    given = report.get("answers")
    answers: dict[str, Any] = given if isinstance(given, dict) else {}
    rows = [
        {"item": item, "our judge": ours.get(item), "MERA judge": mera.get(item), "answer": answers.get(item, "")}
        for item in sorted(set(ours) | set(mera), key=lambda i: (len(str(i)), str(i)))
        if ours.get(item) != mera.get(item)
    ]
    summary = ""
    for name in ("em", "em_mera", "class_accuracy", "judge_mera"):
        ci = report.get(f"{name}_ci95")
        if isinstance(report.get(name), (int, float)) and isinstance(ci, dict):
            summary += (
                f"<li>{esc(name)}: {report[name]:.3f} (95% CI {ci.get('low', 0):.3f}-{ci.get('high', 0):.3f})</li>"
            )
    head = f'<h2>Scores with 95% CIs</h2><ul id="humor-ci">{summary}</ul>' if summary else ""
    return (
        head
        + f'<h2 id="disagreements">Items where the readings disagree ({len(rows)})</h2>'
        + (table(rows) if rows else "<p>none</p>")
    )


def markdown(text: str) -> str:
    """Headings, pipe tables and paragraphs: what the pipelines' reports use."""
    out: list[str] = []
    rows: list[list[str]] = []

    def flush() -> None:
        if rows:
            head, body = rows[0], [r for r in rows[1:] if not all(set(c.strip()) <= set("-: ") for c in r)]
            out.append(
                '<table class="data"><thead><tr>'
                + "".join(f"<th>{esc(c.strip())}</th>" for c in head)
                + "</tr></thead><tbody>"
                + "".join("<tr>" + "".join(f"<td>{esc(c.strip())}</td>" for c in r) + "</tr>" for r in body)
                + "</tbody></table>"
            )
            rows.clear()

    for line in text.splitlines():
        if line.strip().startswith("|"):
            cells = line.strip().strip("|").replace("\\|", "\x00").split("|")  # an escaped pipe is text
            rows.append([c.replace("\x00", "|") for c in cells])
            continue
        flush()
        if line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")), 4)
            out.append(f"<h{level + 1}>{esc(line.lstrip('#').strip())}</h{level + 1}>")
        elif line.strip():
            out.append(f"<p>{esc(line)}</p>")
    flush()
    return "".join(out)


def render(store: Store, run_id: str, rel: str, raw_url: str) -> str:
    """The artifact ``rel`` (under ``<run>/artifacts/``) as an HTML fragment."""
    key = RunLayout(run_id).artifact(rel)
    ext = os.path.splitext(rel)[1].lower()
    link = f'<p><a href="{esc(raw_url)}">download</a></p>'
    if ext in IMAGE_TYPES:
        return f'<img class="plot" alt="{esc(rel)}" src="{esc(raw_url)}">'
    if ext == ".jsonl":
        data, more = head_bytes(store, key, 4 << 20)
        if data is None:
            return "<p>not found</p>"
        rows, bad = [], 0
        for line in data.splitlines()[:HEAD_ROWS]:
            try:
                value = json.loads(line)
                rows.append(value if isinstance(value, dict) else {"value": value})
            except ValueError:
                bad += 1
        note = f"<p>first {len(rows)} rows{' (more in the file)' if more or len(rows) == HEAD_ROWS else ''}</p>"
        note += f"<p class='bad'>{bad} lines are not JSON</p>" if bad else ""
        return link + note + table(rows)
    if ext in (".json", ".md", ".txt"):
        data, more = head_bytes(store, key, MAX_JSON_BYTES)
        if data is None:
            return "<p>not found</p>"
        if more:
            return link + "<p>too large to show here</p>"
        text = data.decode("utf-8", "replace")
        if ext == ".md":
            return link + markdown(text)
        if ext == ".txt":
            return link + f"<pre>{esc(text)}</pre>"
        try:
            value = json.loads(text)
        except ValueError as exc:
            return link + f"<p class='bad'>not readable JSON: {esc(exc)}</p>"
        if isinstance(value, list):
            shown = [v if isinstance(v, dict) else {"value": v} for v in value[:HEAD_ROWS]]
            return link + f"<p>{len(value)} rows</p>" + table(shown)
        if isinstance(value, dict):
            extra = humor_disagreements(value) if "judge_mera_scores" in value else ""
            return link + extra + _mapping(value)
        return link + f"<pre>{cell(value)}</pre>"
    return link


def _json_artifact(store: Store, run_id: str, rel: str) -> Any:
    data, more = head_bytes(store, RunLayout(run_id).artifact(rel), MAX_JSON_BYTES)
    if data is None or more:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def _ci(report: dict[str, Any], name: str) -> str:
    value, ci = report.get(name), report.get(f"{name}_ci95")
    if not isinstance(value, (int, float)):
        return ""
    if isinstance(ci, dict):
        return f"{value:.3f} ({ci.get('low', 0):.3f}-{ci.get('high', 0):.3f})"
    return f"{value:.3f}"


def results(store: Store, run_id: str, pipeline: str, found: list[str], link: str) -> str:
    """The run's headline results on its page: Humor's scores per model with 95% CIs and how many items its
    judges disagree on; Puns' tiers and cloze report; every plot. ``link`` prefixes an artifact's page URL."""
    out = []
    reports = sorted(a for a in found if a.startswith("report/") and a.endswith("/report.json"))
    if pipeline == "humor" and reports:
        rows = []
        for rel in reports:
            report = _json_artifact(store, run_id, rel)
            if not isinstance(report, dict):
                continue
            ours, mera = report.get("judge_scores") or {}, report.get("judge_mera_scores") or {}
            differ = sum(ours.get(i) != mera.get(i) for i in set(ours) | set(mera)) if isinstance(ours, dict) else 0
            model = rel.split("/")[1]
            rows.append(
                f"<tr><td><a href='{esc(link + rel)}'>{esc(model)}</a></td><td>{esc(report.get('n', ''))}</td>"
                f"<td>{_ci(report, 'em')}</td><td>{_ci(report, 'em_mera')}</td><td>{_ci(report, 'class_accuracy')}</td>"
                f"<td>{_ci(report, 'judge_mera')}</td><td>{differ}</td></tr>"
            )
        out.append(
            "<table id='humor-results'><tr><th>model</th><th>n</th><th>EM (95% CI)</th><th>EM, MERA's reading</th>"
            "<th>class accuracy</th><th>MERA judge</th><th>items the judges disagree on</th></tr>"
            + "".join(rows)
            + "</table><p>per-class scores with CIs and the disagreeing items: each model's report</p>"
        )
    if pipeline == "puns":
        ranked = _json_artifact(store, run_id, "puns_ranked.json") if "puns_ranked.json" in found else None
        if isinstance(ranked, list):
            tiers: dict[str, int] = {}
            for joke in ranked:
                tier = joke.get("cloze_tier") if isinstance(joke, dict) else None
                if isinstance(tier, str):
                    tiers[tier] = tiers.get(tier, 0) + 1
            out.append("<h3>Tiers</h3>" + table([{"tier": t, "jokes": n} for t, n in tiers.items()]))
        if "cloze_report/report.md" in found:
            data, more = head_bytes(store, RunLayout(run_id).artifact("cloze_report/report.md"), MAX_JSON_BYTES)
            if data is not None and not more:
                out.append("<h3>Cloze</h3>" + markdown(data.decode("utf-8", "replace")))
    plots = [a for a in found if os.path.splitext(a)[1].lower() in IMAGE_TYPES][:8]
    raw = link.replace("/artifact/", "/raw/")
    thumbs = "".join(
        f"<a href='{esc(link + p)}'><img class='thumb' alt='{esc(p)}' src='{esc(raw + p)}'></a>" for p in plots
    )
    if thumbs:
        out.append(f"<div class='plots'>{thumbs}</div>")
    return "".join(out)
