"""A run's artifacts as HTML: JSON and JSON-lines as tables, markdown's tables, plots as images.

Large artifacts are never read whole: a JSON-lines file shows its first rows (a local store reads just their
bytes), and a JSON file over ``MAX_JSON_BYTES`` is offered as a download. What an artifact means to its
pipeline (the items where two judges disagree, say) is the pipeline's to say
(:mod:`punchline.viewer.pipeline_results`), shown above the artifact as this module shows it.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from punchline.cluster.result_sections import MAX_READ_BYTES, head_bytes
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store

MAX_JSON_BYTES = MAX_READ_BYTES
HEAD_ROWS = 200
IMAGE_TYPES = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
TEXT_TYPES = {".json": "application/json", ".jsonl": "application/x-ndjson", ".md": "text/plain", ".txt": "text/plain"}


def content_type(key: str) -> str:
    ext = os.path.splitext(key)[1].lower()
    return IMAGE_TYPES.get(ext) or TEXT_TYPES.get(ext) or "application/octet-stream"


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=False)
        return esc(text if len(text) <= 300 else text[:297] + "...")
    return esc(value)


def table(rows: Sequence[Mapping[str, Any]], cls: str = "data", render: Callable[[Any], str] = cell) -> str:
    """Rows as an HTML table, its columns in their first appearance's order; ``render`` writes one cell."""
    cols: list[str] = []
    for row in rows:
        cols += [c for c in row if c not in cols]
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{render(r.get(c, ''))}</td>" for c in cols) + "</tr>" for r in rows)
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


def render(store: Store, run_id: str, rel: str, raw_url: str, extra: str = "") -> str:
    """The artifact ``rel`` (under ``<run>/artifacts/``) as an HTML fragment; ``extra`` (its pipeline's sections,
    HTML) goes above its own rendering, under the download link."""
    key = RunLayout(run_id).artifact(rel)
    ext = os.path.splitext(rel)[1].lower()
    link = f'<p><a href="{esc(raw_url)}">download</a></p>'
    if ext in IMAGE_TYPES:
        return extra + f'<img class="plot" alt="{esc(rel)}" src="{esc(raw_url)}">'
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
        return link + extra + note + table(rows)
    if ext in (".json", ".md", ".txt"):
        data, more = head_bytes(store, key, MAX_JSON_BYTES)
        if data is None:
            return "<p>not found</p>"
        if more:
            return link + extra + "<p>too large to show here</p>"
        text = data.decode("utf-8", "replace")
        if ext == ".md":
            return link + extra + markdown(text)
        if ext == ".txt":
            return link + extra + f"<pre>{esc(text)}</pre>"
        try:
            value = json.loads(text)
        except ValueError as exc:
            return link + extra + f"<p class='bad'>not readable JSON: {esc(exc)}</p>"
        if isinstance(value, list):
            shown = [v if isinstance(v, dict) else {"value": v} for v in value[:HEAD_ROWS]]
            return link + extra + f"<p>{len(value)} rows</p>" + table(shown)
        if isinstance(value, dict):
            return link + extra + _mapping(value)
        return link + extra + f"<pre>{cell(value)}</pre>"
    return link + extra


def plots(found: list[str], link: str) -> str:
    """Thumbnails of the run's first plots; ``link`` prefixes an artifact's page URL."""
    shown = [a for a in found if os.path.splitext(a)[1].lower() in IMAGE_TYPES][:8]
    raw = link.replace("/artifact/", "/raw/")
    thumbs = "".join(
        f"<a href='{esc(link + p)}'><img class='thumb' alt='{esc(p)}' src='{esc(raw + p)}'></a>" for p in shown
    )
    return f"<div class='plots'>{thumbs}</div>" if thumbs else ""
