"""The run's own pipeline's results on the viewer's pages: the sections its optional ``results`` and
``artifact_results`` hooks return (:mod:`punchline.cluster.result_sections`), as HTML written and escaped here.

The viewer names no pipeline: it finds the run's by the name in its record, through the registry, decodes the
run's table with the pipeline's ``settings_type`` and asks. A pipeline that is not installed here, a config this
version cannot read, or a hook that raises is one line on the page, never a failed page: the run's artifacts and
plots are shown either way.
"""

from __future__ import annotations

from typing import Any

import msgspec
import structlog

from punchline.cluster.registry import resolve
from punchline.cluster.result_sections import Cell, Link, ResultSection, ResultsView
from punchline.viewer.artifacts import cell, esc, markdown, table

log = structlog.get_logger("punchline.view")


class RunPipeline:
    """The pipeline a run's record names and the run's settings as it decodes them, or why not (``note``)."""

    def __init__(self, pipeline: str, config_toml: str) -> None:
        self.name = pipeline
        self.plugin: Any = None
        self.settings: Any = None
        self.note = ""
        try:
            self.plugin = resolve(pipeline)
        except Exception as exc:  # not installed here, or a plug-in that cannot be imported
            self.note = f"the {pipeline} pipeline cannot be loaded here: {_line(exc)}"
            return
        try:
            tables = msgspec.toml.decode(config_toml.encode(), type=dict[str, Any])
            self.settings = msgspec.convert(tables.get(self.plugin.name, {}), self.plugin.settings_type)
        except Exception:  # a config another version wrote: a hook that needs no settings still answers
            self.settings = None

    def sections(self, view: ResultsView, hook: str, *args: str) -> tuple[list[ResultSection], str]:
        """What the pipeline's ``hook`` returns for ``view`` (none when it has no such hook), and a note when it
        could not be asked or raised."""
        if self.plugin is None:
            return [], self.note
        own = getattr(self.plugin, hook, None)
        if not callable(own):
            return [], ""
        view.settings = self.settings
        try:
            found = own(view, *args)
            if not isinstance(found, list) or not all(isinstance(s, ResultSection) for s in found):
                raise TypeError(f"{hook} returned {type(found).__name__}, not a list of ResultSection")
            return found, ""
        except Exception as exc:  # a plug-in's bug is a line on the page, the rest of the page is shown
            log.warning("view_pipeline_hook_failed", pipeline=self.name, hook=hook, error=_line(exc))
            return [], f"the {self.name} pipeline's {hook} failed: {_line(exc)}"


def _line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300] if str(exc) else type(exc).__name__


def render_sections(sections: list[ResultSection], link: str, note: str = "", level: int = 3) -> str:
    """``sections`` as HTML (headings at ``level``); ``link`` prefixes an artifact's page URL (a :class:`Link`)."""
    out = []
    for s in sections:
        parts = [f"<h{level}>{esc(s.title)}</h{level}>"] if s.title else []
        if s.items:
            parts.append("<ul>" + "".join(f"<li>{esc(i)}</li>" for i in s.items) + "</ul>")
        if s.rows:
            parts.append(_table(s.rows, link))
        elif s.empty:
            parts.append(f"<p>{esc(s.empty)}</p>")
        if s.markdown:
            parts.append(markdown(s.markdown))
        if s.note:
            parts.append(f"<p>{esc(s.note)}</p>")
        anchor = f' id="{esc(s.anchor)}"' if s.anchor else ""
        out.append(f"<section class='results'{anchor}>{''.join(parts)}</section>")
    if note:
        out.append(f"<p class='bad'>{esc(note)}</p>")
    return "".join(out)


def _table(rows: list[dict[str, Cell]], link: str) -> str:
    return table(rows, render=lambda value: _cell(value, link))


def _cell(value: Cell, link: str) -> str:
    if isinstance(value, Link):
        return f"<a href='{esc(link + value.artifact)}'>{esc(value.text)}</a>"
    return cell("" if value is None else value)
