"""The generic stages a study composes, generate -> (judge), over a ``[prompts]``-shaped table.

They are the engine's: the built-in ``prompts`` pipeline (``pipelines/prompts/``) registers them as they are, and
a plug-in's ``Generate``/``Judge`` stages (:mod:`punchline.plugin.stages`) run them over their own arguments.

``generate`` is one unit per row x model, asking for ``n`` samples in one request (the request's
``n``; a provider without ``n`` splits it, online and in batches, as for every pipeline), so the
response cache, batch mode, resume and overlap hold as they do for the built-in workloads: the units
are plain :class:`ProviderRequest`s with content-addressed keys. ``judge`` is one unit per row x
model x sample that has an answer; two equal answers to one row make one judge request, paid once.

Unit ids are row-major (``generate/r<row>/m<model>``, ``judge/r<row>/m<model>/s<sample>``), so the
plan streams in order and ``outputs.*`` (row, then model, then sample) are written in plan order.
The last stage writes ``outputs.jsonl`` and ``outputs.parquet`` (the input columns, then the answer's:
:mod:`punchline.cluster.stages.outputs`); with a judge, ``generate`` writes the same rows without judge or
input columns to ``answers.jsonl``, which the judge's plan and reduce read (a resumed run re-plans the
judge from it and gets the same units). The judge reads the answers ``[prompts.judge] where`` and
``fraction`` choose; a judge request longer than ``max_request_chars`` (a long answer) is not sent, and
its row says why in ``judge_parse_error``.

Cost columns say what a request was charged: the online price, or the batch price (the provider's
``batch_price_factor`` of it) when its stage's mode for its provider is ``batch`` (``mode`` column).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping

import msgspec
import structlog

from punchline.cluster.config import RunConfig, resolve_path
from punchline.cluster.pipeline import Stage, StageContext
from punchline.cluster.stages.compiled import CompiledPrompts
from punchline.cluster.stages.outputs import (
    ANSWERS_JSONL,
    OUTPUTS_JSONL,
    OUTPUTS_PARQUET,
    Layout,
    OutputRow,
    jsonl_chunks,
    parquet_chunks,
    read_jsonl_chunks,
)
from punchline.cluster.stages.rows import Row, check_rows, iter_rows, load_rows
from punchline.cluster.stages.settings import ParseSettings, PromptsSettings, sampling_for
from punchline.cluster.stages.simulate import (
    answer_parse,
    generate_answers,
    judge_answers,
    judged_prompt,
    marked_parse,
    model_names,
    reference_of,
    split_prompt,
)
from punchline.data.answer_format import ANSWER_MARK, StageAnswers, prompt_digest
from punchline.data.errors import InputError
from punchline.data.provider_settings import Mode
from punchline.data.requests import ProviderRequest
from punchline.data.storage.run_layout import RunLayout
from punchline.data.store import Store
from punchline.data.units import UnitResult, UnitSpec

#: a stage none of whose answers parsed says so once it has at least this many: below it a study is a smoke test
#: whose rows its author reads anyway; from it, if the model parses a third of its answers, 0 of 20 is a chance of
#: less than 1 in 3,000, so the parse (or the prompt) is wrong, not the luck
NEVER_PARSED_AFTER = 20
CHECK_CHUNK = 1_000  # rows whose prompts the input check renders at a time

log = structlog.get_logger("punchline.stages")


def settings_of(cfg: RunConfig) -> PromptsSettings:
    """The run's ``[prompts]`` table, decoded."""
    assert isinstance(cfg.settings, PromptsSettings), "not a prompts config"
    return cfg.settings


class Job:
    """The ``[prompts]`` table compiled against the run's providers, and its rows, read as a stream
    (:meth:`each_row`): each pass over the rows (the check, the plan, the simulator's answers, the output's
    columns, the reduce) reads the file again a chunk at a time, so the driver holds a chunk, not the rows
    (issue 42)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.settings = settings_of(cfg)
        self.compiled = CompiledPrompts(self.settings, file=cfg.source)
        self.data_file = str(resolve_path(cfg, self.settings.data))
        self._rows: list[Row] | None = None
        self._first: Row | None = None
        self._reference: str | None = None  # the reference column, once found ("": none)
        self._modes: dict[tuple[str, str], Mode] = {}
        self._schema = _schema_text(self.settings.parse)  # once, not per request
        self._judge_schema = _schema_text(self.settings.judge.parse if self.settings.judge is not None else None)

    @property
    def rows(self) -> list[Row]:
        """Every row at once (for a test or a notebook: the stages stream them with :meth:`each_row`)."""
        if self._rows is None:
            self._rows = load_rows(self.data_file, self.settings.id_field)
        return self._rows

    def each_row(self) -> Iterator[Row]:
        """The rows in file order, read a chunk at a time (checked by :meth:`check` before a run reads them)."""
        return iter_rows(self.data_file, self.settings.id_field)

    @property
    def first(self) -> Row | None:
        """The first row: its columns say which is the reference (:func:`~.simulate.reference_of`)."""
        if self._first is None:
            self._first = next(self.each_row(), None)
        return self._first

    def check(self) -> None:
        """The input check: rows load, every row's messages render (judge's included), the reference column is
        in every row, before any call."""
        check_rows(self.data_file, self.settings.id_field)
        rows = self.each_row()
        while chunk := list(itertools.islice(rows, CHECK_CHUNK)):
            self.compiled.check_rows(chunk, self.data_file)
        column = self.settings.reference
        for row in self.each_row() if column is not None else ():
            if column not in row.fields:
                raise InputError(
                    f"no column {column!r} (the rows' reference)", file=self.data_file, record=row.where, field=column
                )

    def reference(self, row: Row) -> object:
        """The row's reference (None: the stage has none), as :func:`~.simulate.reference_of` finds its column."""
        if self._reference is None:
            self._reference = reference_of(self.settings, self.compiled.parser, self.first)[0]
        return row.fields.get(self._reference) if self._reference else None

    def model_names(self, models: list[tuple[str, str, str]]) -> dict[str, list[str]]:
        return model_names(models, self.model_id)

    def model_id(self, provider: str, nick: str) -> str:
        return self.cfg.provider(provider).model_id(nick)

    def generate_request(self, row: Row, entry: str, provider: str, nick: str) -> ProviderRequest:
        s = sampling_for(self.settings, entry)
        return ProviderRequest(
            provider=provider,
            model=self.model_id(provider, nick),
            messages=self.compiled.messages(row, self.data_file),
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=s.max_tokens,
            n=self.settings.n,
            stop=s.stop,
            seed=s.seed,
            response_schema=self._schema,
        )

    def judge_request(self, row: Row, out: OutputRow) -> ProviderRequest:
        judge = self.settings.judge
        assert judge is not None and self.compiled.judge_model is not None and out.text is not None
        provider, nick = self.compiled.judge_model
        return ProviderRequest(
            provider=provider,
            model=self.model_id(provider, nick),
            messages=self.compiled.judge_messages(
                row, self.data_file, response=out.text, parsed=out.parsed, model=out.model, sample=out.sample
            ),
            temperature=judge.temperature,
            max_tokens=judge.max_tokens,
            seed=judge.seed,
            response_schema=self._judge_schema,
        )

    def mode(self, stage: str, provider: str) -> Mode:
        """How ``stage``'s requests to ``provider`` are priced: the stage's own mode, else the provider's."""
        key = (stage, provider)
        if key not in self._modes:
            self._modes[key] = self.cfg.stage_mode(stage) or self.cfg.provider(provider).mode
        return self._modes[key]

    def cost_usd(self, stage: str, provider: str, model: str, result: UnitResult) -> tuple[float, Mode]:
        """What the request (to ``provider``'s ``model``) was charged, and in which mode (batch: the provider's
        batch price)."""
        mode = self.mode(stage, provider)
        r = result.response
        if r is None:
            return 0.0, mode
        settings = self.cfg.provider(provider)
        online = settings.cost_usd(model, r.input_tokens, r.output_tokens)
        return (online * settings.batch_price_factor if mode == "batch" else online), mode

    def layout(self) -> Layout:
        """The output files' columns: the rows' input columns and the parsers' declared fields."""
        compiled = self.compiled
        return Layout(
            lambda: (row.fields for row in self.each_row()),
            parsed=compiled.parser.types if compiled.parser is not None else None,
            judge_parsed=compiled.judge_parser.types if compiled.judge_parser is not None else None,
        )


def _schema_text(parse: ParseSettings | None) -> str | None:
    """The JSON schema a request carries as its structured-output format (``structured = true``)."""
    if parse is None or not parse.structured or parse.json_schema is None:
        return None
    return msgspec.json.encode(parse.json_schema, order="sorted").decode()


def _generate_id(row: int, model: int) -> str:
    return f"generate/r{row:09d}/m{model:04d}"


def _judge_id(row: int, model: int, sample: int) -> str:
    return f"judge/r{row:09d}/m{model:04d}/s{sample:04d}"


def _missing(unit_id: str) -> UnitResult:
    return UnitResult(unit_id=unit_id, key="", error="no result")


Rows = Iterator[tuple[OutputRow, Row]]


def _write_outputs(ctx: StageContext, job: Job, rows: Callable[[], Rows]) -> list[str]:
    """Both files from two passes over the rows (streamed: memory is a Parquet row group, not the run)."""
    layout = job.layout()
    ctx.write_artifact_chunks(OUTPUTS_JSONL, jsonl_chunks(((o, r.fields) for o, r in rows()), layout))
    ctx.write_artifact_chunks(OUTPUTS_PARQUET, parquet_chunks(((o, r.fields) for o, r in rows()), layout))
    return [OUTPUTS_JSONL, OUTPUTS_PARQUET]


class GenerateStage:
    """Every row x model, ``n`` samples in one request; parsed when ``[prompts.parse]`` is set."""

    name = "generate"

    def _units(self, job: Job) -> Iterator[tuple[Row, int, str, UnitSpec]]:
        for ri, row in enumerate(job.each_row()):
            for mi, (entry, provider, nick) in enumerate(job.compiled.models):
                request = job.generate_request(row, entry, provider, nick)
                yield row, mi, entry, UnitSpec(unit_id=_generate_id(ri, mi), request=request)

    def plan(self, ctx: StageContext) -> Iterable[UnitSpec]:
        job = Job(ctx.cfg)
        return (unit for _, _, _, unit in self._units(job))

    def simulated_answers(self, cfg: RunConfig, name: str | None = None) -> list[StageAnswers]:
        """What its answers parse into and each row's reference, for the simulated provider (:mod:`.simulate`)."""
        job = Job(cfg)
        prompts = (
            (prompt_digest(*split_prompt(job.compiled.messages(r, job.data_file))), job.reference(r))
            for r in job.each_row()
        )
        models = job.model_names(job.compiled.models)
        return [generate_answers(name or self.name, job.settings, job.compiled.parser, job.first, prompts, models)]

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        job = Job(ctx.cfg)
        never_parsed(ctx, self.name, job.settings.parse, (o for o, _ in self._rows(job, results)), judge=False)
        if job.settings.judge is not None:
            ctx.write_artifact_chunks(ANSWERS_JSONL, jsonl_chunks((o, {}) for o, _ in self._rows(job, results)))
            return [ANSWERS_JSONL]
        return _write_outputs(ctx, job, lambda: self._rows(job, results))

    def _rows(self, job: Job, results: Mapping[str, UnitResult]) -> Rows:
        """Every output row in order, from the plan's unit ids (a prompt is rendered again only for a result that
        lacks its request key: rendering every prompt was half of a reduce's time)."""
        models = [(mi, entry, provider, nick, job.model_id(provider, nick))
                  for mi, (entry, provider, nick) in enumerate(job.compiled.models)]  # fmt: skip
        for ri, row in enumerate(job.each_row()):
            for mi, entry, provider, nick, model in models:
                unit_id = _generate_id(ri, mi)
                result = results.get(unit_id) or _missing(unit_id)
                key = result.key or job.generate_request(row, entry, provider, nick).key()
                yield from self._samples(job, row, entry, result, key, job.cost_usd(self.name, provider, model, result))

    def _samples(
        self, job: Job, row: Row, entry: str, result: UnitResult, key: str, priced: tuple[float, Mode]
    ) -> Rows:
        """One output row per sample of a unit's answer (``key``: its request's; ``priced``: its cost and mode)."""
        parser = job.compiled.parser
        cost, mode = priced
        response = result.response
        texts = response.texts if response is not None else []
        reasons = response.finish_reasons if response is not None else []
        for sample in range(job.settings.n):
            text = texts[sample] if sample < len(texts) else None
            parsed = parser.parse(text) if parser is not None and text is not None else None
            yield (
                OutputRow(
                    row_id=row.id,
                    model=entry,
                    sample=sample,
                    text=text,
                    parsed=parsed.fields if parsed is not None else None,
                    parse_error=parsed.error if parsed is not None else None,
                    finish_reason=reasons[sample] or None if sample < len(reasons) else None,
                    input_tokens=response.input_tokens if response is not None else 0,
                    output_tokens=response.output_tokens if response is not None else 0,
                    cost_usd=cost,
                    mode=mode,
                    request_key=key,
                    error=result.error or (None if text is not None else "no answer for this sample"),
                ),
                row,
            )


class JudgeStage:
    """The judge model reads each chosen answer (row x model x sample); its verdict is parsed by its own parser."""

    name = "judge"

    def _units(self, ctx: StageContext, job: Job) -> Iterator[tuple[OutputRow, Row, UnitSpec | str | None]]:
        """Every output row, its input row and the judge's unit for it: None when the judge does not read
        it (no answer, or not chosen by ``where``/``fraction``), the reason when its request is too long."""
        rows = enumerate(job.each_row())
        ri, row = -1, None
        models = {entry: mi for mi, (entry, _, _) in enumerate(job.compiled.models)}
        compiled = job.compiled
        for out in read_jsonl_chunks(ctx.read_artifact_chunks(ANSWERS_JSONL)):  # streamed: the run's answers
            while row is None or row.id != out.row_id:  # the answers are in row order: the rows are walked along
                ri, row = next(rows, (ri, None))
                if row is None:
                    raise InputError(
                        f"has no row {out.row_id!r} of {ANSWERS_JSONL} (changed since generate ran?)",
                        file=job.data_file,
                    )
            chosen = out.text is not None and compiled.judged(
                row, response=out.text, parsed=out.parsed, model=out.model, sample=out.sample
            )
            if chosen is False:
                yield out, row, None
                continue
            if isinstance(chosen, str):
                yield out, row, chosen
                continue
            request = job.judge_request(row, out)
            too_long = compiled.judge_size(request.messages)
            if too_long is not None:
                yield out, row, too_long
                continue
            yield out, row, UnitSpec(unit_id=_judge_id(ri, models[out.model], out.sample), request=request)

    def plan(self, ctx: StageContext) -> Iterable[UnitSpec]:
        job = Job(ctx.cfg)
        return (unit for _, _, unit in self._units(ctx, job) if isinstance(unit, UnitSpec))

    def simulated_answers(self, cfg: RunConfig, name: str | None = None) -> list[StageAnswers]:
        """Its verdicts' parse and every row's prompt with the judged answer left out, for the simulated
        provider (:mod:`.simulate`)."""
        job = Job(cfg)
        compiled = job.compiled
        assert compiled.judge_model is not None
        parsed = marked_parse(compiled.parser)
        judged = [
            judged_prompt(
                compiled.judge_messages(r, job.data_file, response=ANSWER_MARK, parsed=parsed, model="", sample=0),
                job.reference(r),
            )
            for r in job.each_row()
        ]
        models = job.model_names([("", *compiled.judge_model)])
        return [judge_answers(name or self.name, job.settings, compiled.parser, job.first, judged, models)]

    def reduce(self, ctx: StageContext, results: Mapping[str, UnitResult]) -> list[str]:
        job = Job(ctx.cfg)
        judge = job.settings.judge
        assert judge is not None
        never_parsed(ctx, self.name, judge.parse, (o for o, _ in self._rows(ctx, job, results)), judge=True)
        return _write_outputs(ctx, job, lambda: self._rows(ctx, job, results))

    def _rows(self, ctx: StageContext, job: Job, results: Mapping[str, UnitResult]) -> Rows:
        parser = job.compiled.judge_parser
        for out, row, unit in self._units(ctx, job):
            if isinstance(unit, str):
                yield msgspec.structs.replace(out, judge_parse_error=unit), row
                continue
            if unit is None:
                yield out, row
                continue
            result = results.get(unit.unit_id) or _missing(unit.unit_id)
            text = result.response.texts[0] if result.response is not None and result.response.texts else None
            parsed = parser.parse(text) if parser is not None and text is not None else None
            cost, mode = job.cost_usd(self.name, unit.request.provider, unit.request.model, result)
            judged = msgspec.structs.replace(
                out,
                judge_text=text,
                judge_parsed=parsed.fields if parsed is not None else None,
                judge_parse_error=result.error if text is None else parsed.error if parsed is not None else None,
                judge_request_key=result.key or unit.request.key(),
                judge_cost_usd=cost,
                judge_mode=mode,
            )
            yield judged, row


def never_parsed(
    ctx: StageContext, stage: str, parse: ParseSettings | None, rows: Iterable[OutputRow], *, judge: bool
) -> None:
    """Logs ``answers_never_parsed`` (a warning the progress line and the run's summary show) when a stage with a
    parse step has :data:`NEVER_PARSED_AFTER` answers or more and not one of them parsed."""
    if parse is None:
        return
    answered = parsed = 0
    for r in rows:
        text, fields = (r.judge_text, r.judge_parsed) if judge else (r.text, r.parsed)
        answered += text is not None
        parsed += fields is not None
        if parsed:
            return
    if answered < NEVER_PARSED_AFTER:
        return
    how = answer_parse(parse)
    assert how is not None
    log.warning(
        "answers_never_parsed",
        run_id=ctx.run_id,
        stage=getattr(ctx.cfg, "stage_names", {}).get(stage, stage),  # a plug-in's stage: its own name
        answers=answered,
        how=how.how,
    )


def check_inputs(cfg: RunConfig) -> None:
    """One line (exit 2) on a bad row, a missing template field or a bad template, before anything starts."""
    Job(cfg).check()


def judge_upper_bound(cfg: RunConfig) -> list[UnitSpec]:
    """The judge's units before any answer exists: one per row x model x sample, each judging a stand-in
    answer as long as the model may write (``max_tokens`` x 4 characters)."""
    job = Job(cfg)
    judge = job.settings.judge
    units = []
    for ri, row in enumerate(job.each_row()):
        for mi, (entry, _, _) in enumerate(job.compiled.models):
            stand_in = "x" * 4 * sampling_for(job.settings, entry).max_tokens
            for sample in range(job.settings.n):
                if judge is not None and not job.compiled.drawn(row, entry, sample):
                    continue  # the draw is known before any answer (``where`` is not: it counts as true)
                out = OutputRow(row_id=row.id, model=entry, sample=sample, text=stand_in)
                units.append(UnitSpec(unit_id=_judge_id(ri, mi, sample), request=job.judge_request(row, out)))
    return units


def stages(cfg: RunConfig) -> list[Stage]:
    out: list[Stage] = [GenerateStage()]
    if settings_of(cfg).judge is not None:
        out.append(JudgeStage())
    return out


class ModelCounts(msgspec.Struct, kw_only=True):
    """One model's rows of ``outputs.jsonl``: what the headlines and the viewer's results table say of it."""

    model: str  # as ``[prompts] models`` names it
    samples: int = 0
    answered: int = 0  # samples with a text (the others failed after their retries)
    parsed: int = 0  # answered samples whose text parsed (``[prompts] parse``)
    verdicts: dict[str, int] = {}  # the judge's verdict (its first parsed field, as text) -> samples


def model_counts(settings: PromptsSettings, rows: Iterable[OutputRow]) -> list[ModelCounts]:
    """Per model of ``settings``, in its order: samples, answered, parsed, and the judge's verdicts."""
    counts = {entry: ModelCounts(model=entry) for entry in settings.models}
    for r in rows:
        c = counts.get(r.model)
        if c is None:  # a model the settings do not name: not one of this run's
            continue
        c.samples += 1
        if r.text is not None:
            c.answered += 1
            c.parsed += r.parsed is not None
            if r.judge_parsed is not None:
                verdict = str(next(iter(r.judge_parsed.values()), None))
                c.verdicts[verdict] = c.verdicts.get(verdict, 0) + 1
    return list(counts.values())


def summary_lines(cfg: RunConfig, store: Store, run_id: str) -> list[str]:
    """Per model: samples answered, the share that parsed, and the judge's verdicts (its first parsed field)."""
    chunks = store.get_chunks(RunLayout(run_id).artifact(OUTPUTS_JSONL))  # streamed: a 10^6-row file is not held
    if chunks is None:
        return []
    settings = settings_of(cfg)
    out = []
    for c in model_counts(settings, read_jsonl_chunks(chunks)):
        line = f"**{c.model}**: {c.answered}/{c.samples} samples answered"
        if settings.parse is not None and c.answered:
            line += f", {c.parsed / c.answered:.0%} parsed"
        if c.verdicts:
            line += ", judge: " + ", ".join(f"{v} {n}" for v, n in sorted(c.verdicts.items()))
        out.append(line)
    return out
