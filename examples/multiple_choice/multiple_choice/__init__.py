"""Multiple choice: every model answers every question n times, a judge grades each answer against the key.

Stage `answer` writes answer.jsonl/.parquet; stage `grade` adds the judge's verdicts (grade.jsonl/.parquet)
and writes per_model.csv (accuracy by the parsed option and by the judge) and accuracy.png.
"""

from collections import Counter, defaultdict

from punchline.plugin import Generate, InputFile, Judge, Model, Models, Pipeline, Settings, bar_plot, write_csv

ASK = """{{ question }}
Options: {{ options | join(" | ") }}
Reply with one option as "Answer: <option>"."""

GRADE = """Does the response give the reference answer? Reply VERDICT: correct or VERDICT: incorrect.
Reference: {{ answer }}
Response: {{ response | replace("\\n", " ") }}"""


class MCSettings(Settings):
    questions: InputFile  # JSONL: {"id", "question", "options": [...], "answer"} per line
    models: Models
    judge: Model
    n: int = 3  # samples per question and model (1 to 1000: checked by the stage)


def report(ctx, rows):
    """Per model: its answers, and the share right by exact match of the parsed option and by the judge."""
    counts = defaultdict(Counter)
    for r in rows:
        c = counts[r["model"]]
        c["answers"] += 1
        c["exact"] += (r["parsed"] or {}).get("option") == r["answer"]
        c["judged"] += (r["judge_parsed"] or {}).get("verdict") == "correct"
    table = [
        {
            "model": m,
            "answers": c["answers"],
            "exact_match": c["exact"] / c["answers"],
            "judge": c["judged"] / c["answers"],
        }
        for m, c in counts.items()
    ]
    accuracy = {k: {t["model"]: t[k] for t in table} for k in ("exact_match", "judge")}
    return [write_csv(ctx, "per_model.csv", table), bar_plot(ctx, "accuracy.png", accuracy, ylim=(0, 1))]


class MultipleChoice(Pipeline):
    name = "mc"
    settings_type = MCSettings

    def stages(self, cfg):
        s = cfg.settings
        parse = r"Answer:\s*(?P<option>\w+)"
        answer = Generate(s.questions, ASK, models=s.models, n=s.n, parse=parse, temperature=1.0, name="answer")
        grade = Judge(answer, GRADE, model=s.judge, parse=r"VERDICT: (?P<verdict>\w+)", name="grade", reduce=report)
        return [answer, grade]
