"""Multiple choice: every model answers every question n times, a judge grades each answer against the key.

Reports each model's accuracy with its 95 % Wilson interval (per_model.csv, accuracy.png/.svg) and each pair of
models compared on the same answers (paired.csv with McNemar's test, paired.png/.svg)."""

from punchline import plugin as pl

ASK = '{{ question }}\nOptions: {{ options | join(" | ") }}\nReply with one option as "Answer: <option>".'
GRADE = """Does the response give the reference answer? Reply VERDICT: correct or VERDICT: incorrect.
Reference: {{ answer }}\nResponse: {{ response | replace("\\n", " ") }}"""
RIGHT = {  # an answer's outcome by metric: 1 right, 0 wrong, None (no verdict read) left out
    "exact_match": lambda r: (r["parsed"] or {}).get("option") == r["answer"],
    "judge": lambda r: {"correct": 1, "incorrect": 0}.get((r["judge_parsed"] or {}).get("verdict")),
}


class MCSettings(pl.Settings):
    questions: pl.InputFile  # JSONL: {"id", "question", "options": [...], "answer"} per line
    models: pl.Models
    judge: pl.Model
    n: int = 3  # samples per question and model (1 to 1000: checked by the stage)


def report(ctx, rows):
    """Each model's accuracy with its interval; the models compared on the same (question, sample) answers."""
    by_metric = {metric: pl.outcomes(rows, right) for metric, right in RIGHT.items()}
    table, pairs = ({m: f(o) for m, o in by_metric.items()} for f in (pl.per_model, pl.compare_models))
    return [
        pl.write_csv(ctx, "per_model.csv", pl.estimate_rows(table)),
        pl.write_csv(ctx, "paired.csv", pl.comparison_rows(pairs)),
        *pl.write_figure(ctx, "accuracy", pl.error_bars(table, title="Accuracy by model", ylabel="% right")),
        *pl.write_figure(ctx, "paired", pl.paired_differences(pairs, title="Accuracy: models on the same answers")),
    ]


class MultipleChoice(pl.Pipeline):
    name, settings_type = "mc", MCSettings

    def stages(self, cfg):
        s, parse = cfg.settings, r"Answer:\s*(?P<option>\w+)"
        answer = pl.Generate(s.questions, ASK, models=s.models, n=s.n, parse=parse, temperature=1.0, name="answer")
        grade = pl.Judge(answer, GRADE, model=s.judge, parse=r"VERDICT: (?P<verdict>\w+)", name="grade", reduce=report)
        return [answer, grade]
