"""Differential test: ``em_mera`` against a line-for-line transcription of the official MERA scorer.

The transcription below is MERA's ``remove_whitespace_and_nones`` filter (benchmark_tasks/humor/utils.py
in MERA-Evaluation/MERA) and SQuAD's ``normalize_answer`` / ``compute_exact`` (transformers'
``squad_metrics``), kept as close to the originals as Python allows and independent of our module.
A generated corpus of answers (right, wrong class, wrong letter, both wrong) over many surface forms
must be scored identically by both; where the official filter raises, ours must give 0. On the same
corpus the robust parser must never credit a wrong answer, and must credit every answer the official
scorer credits unless it refused it as ambiguous (two answers that disagree: the official takes the first).
"""

from __future__ import annotations

import random
import re
import string
from collections import Counter

from punchline.data.humor.mera import em_mera
from punchline.data.humor.parser import parse_answer
from punchline.data.humor.schema import CLASSES, LETTERS, class_key, split_output

# --- the official scorer, transcribed -----------------------------------------------------------


def official_filter_set(inst: list[str | None]) -> list[str]:
    filtered_resp = []
    for resp in inst:
        if not resp:
            resp = ""
        else:
            resp = resp.split("\n")
            answer = resp[0].lstrip().split("ОТВЕТ ")[-1].strip()
            solution = resp[1].lstrip().split("РЕШЕНИЕ ")[-1].strip()
            resp = answer + "," + solution
        filtered_resp.append(resp)
    return filtered_resp


def official_normalize_answer(s: str) -> str:
    def remove_articles(text: str) -> str:
        regex = re.compile(r"\b(a|an|the)\b", re.UNICODE)
        return re.sub(regex, " ", text)

    def white_space_fix(text: str) -> str:
        return " ".join(text.split())

    def remove_punc(text: str) -> str:
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text: str) -> str:
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def official_compute_exact(a_gold: str, a_pred: str) -> int:
    return int(official_normalize_answer(a_gold) == official_normalize_answer(a_pred))


def official_em(gold: str, text: str) -> int | None:
    """The official score, or None where the official filter raises (a one-line answer)."""
    try:
        pred = official_filter_set([text])[0]
    except IndexError:
        return None
    return official_compute_exact(gold, pred)


# --- the corpus ----------------------------------------------------------------------------------

LATIN = {"А": "A", "Б": "B", "В": "C", "Г": "D"}  # a model answering by position
# Canonical forms are repeated so that a fair share of the right answers is credited officially.
TRAILING = ["", "", "", " ", "\t", "  ", " \t", "\u00a0", "\r"]
LEADING = ["", "", "", "", " ", "  ", "\t"]
ANSWER_MARKERS = ["ОТВЕТ "] * 6 + ["ОТВЕТ  ", "ОТВЕТ: ", "ОТВЕТ:", "Ответ ", "ответ: ", "**ОТВЕТ** ", "ОТВЕТ\t", ""]
SOLUTION_MARKERS = ["РЕШЕНИЕ "] * 6 + [
    "РЕШЕНИЕ  ",
    "РЕШЕНИЕ: ",
    "РЕШЕНИЕ:",
    "Решение ",
    "**РЕШЕНИЕ** ",
    "РЕШЕНИЕ\t",
    "",
]
NEWLINES = ["\n"] * 4 + ["\r\n"] * 2 + ["\n\n", "\n \n"]
SUFFIXES = ["", "\n", "\r\n", "\nПояснение: текст похож.", "\n\nОТВЕТ ирония\nРЕШЕНИЕ А"]
OUTCOMES = ("right", "wrong class", "wrong letter", "both wrong")


def _class_form(rng: random.Random, cls: str) -> str:
    form = rng.choice(["as is"] * 5 + ["upper", "title", "quoted", "dot", "bang", "the", "double space"])
    if form == "upper":
        return cls.upper()
    if form == "title":
        return cls[:1].upper() + cls[1:]
    if form == "quoted":
        return f"«{cls}»"
    if form == "dot":
        return f"{cls}."
    if form == "bang":
        return f"{cls}!"
    if form == "the":
        return f"the {cls}"
    if form == "double space":
        return cls.replace(" ", "  ")
    return cls


def _letter_form(rng: random.Random, letter: str) -> str:
    form = rng.choice(["as is"] * 5 + ["lower", "dot", "paren", "latin", "bold"])
    if form == "lower":
        return letter.lower()
    if form == "dot":
        return f"{letter}."
    if form == "paren":
        return f"{letter})"
    if form == "latin":
        return LATIN.get(letter, letter)
    if form == "bold":
        return f"**{letter}**"
    return letter


def _answer(rng: random.Random, cls: str, letter: str) -> str:
    shape = rng.choice(["two lines"] * 6 + ["one line", "reference", "reasoning first", "empty"])
    c, ltr = _class_form(rng, cls), _letter_form(rng, letter)
    if shape == "empty":
        return ""
    if shape == "one line":
        return f"{rng.choice(ANSWER_MARKERS)}{c} {rng.choice(SOLUTION_MARKERS)}{ltr}{rng.choice(TRAILING)}"
    if shape == "reference":
        return f"{c},{ltr}" if rng.random() < 0.5 else f"{c}\n{ltr}"
    first = f"{rng.choice(LEADING)}{rng.choice(ANSWER_MARKERS)}{c}{rng.choice(TRAILING)}"
    second = f"{rng.choice(LEADING)}{rng.choice(SOLUTION_MARKERS)}{ltr}{rng.choice(TRAILING)}"
    text = first + rng.choice(NEWLINES) + second + rng.choice(SUFFIXES)
    if shape == "reasoning first":
        text = "Разберём текст: концовка неожиданная.\n" + text
    return text


def corpus(n: int = 2400, seed: int = 12) -> list[tuple[str, str, str]]:
    """``(outcome, gold, answer)`` triples: the gold is a reference, the answer a model's text."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        outcome = OUTCOMES[i % len(OUTCOMES)]
        cls, letter = rng.choice(CLASSES), rng.choice(LETTERS)
        said_cls = rng.choice([c for c in CLASSES if c != cls]) if outcome in ("wrong class", "both wrong") else cls
        said_letter = (
            rng.choice([x for x in LETTERS if x != letter]) if outcome in ("wrong letter", "both wrong") else letter
        )
        out.append((outcome, f"{cls},{letter}", _answer(rng, said_cls, said_letter)))
    return out


def test_em_mera_agrees_with_the_official_scorer_on_every_generated_answer() -> None:
    answers = corpus()
    assert len(answers) >= 2000
    disagreements = []
    official_scores: Counter[str] = Counter()
    for outcome, gold, text in answers:
        official = official_em(gold, text)
        official_scores[f"{outcome}: {'crash' if official is None else official}"] += 1
        expected = 0 if official is None else official
        if em_mera(gold, text) != expected:
            disagreements.append((gold, text, expected))
    assert not disagreements, f"{len(disagreements)} of {len(answers)} disagree, e.g. {disagreements[:5]}"
    # the corpus exercises every branch: credited and failed answers, and one-line answers that crash
    assert official_scores["right: 1"] >= 100 and official_scores["right: 0"] >= 200
    assert all(official_scores[f"{o}: crash"] >= 10 for o in OUTCOMES)
    assert all(official_scores[f"{o}: 1"] == 0 for o in OUTCOMES[1:])  # a wrong answer is never credited


def test_corpus_covers_the_whitespace_cases_where_the_old_reading_differed() -> None:
    texts = [text for _, _, text in corpus()]
    assert sum("\r\n" in t for t in texts) >= 100
    assert sum(" \n" in t or "\t\n" in t for t in texts) >= 100
    assert sum("РЕШЕНИЕ  " in t for t in texts) >= 50
    assert sum(t.count("\n") == 0 and t != "" for t in texts) >= 100

    def unstripped(gold: str, text: str) -> int:  # the reading without lstrip()/strip(), as em_mera once was
        lines = text.split("\n")
        return official_compute_exact(gold, lines[0].split("ОТВЕТ ")[-1] + "," + lines[1].split("РЕШЕНИЕ ")[-1])

    only_when_stripped = [t for _, g, t in corpus() if official_em(g, t) == 1 and unstripped(g, t) == 0]
    assert len(only_when_stripped) >= 50


def test_robust_parser_credits_what_the_official_scorer_credits_and_never_a_wrong_answer() -> None:
    credited: Counter[str] = Counter()
    for outcome, gold, text in corpus():
        parsed = parse_answer(text)
        cls, letter = split_output(gold) or ("", "")
        robust = int(parsed.cls is not None and class_key(parsed.cls) == class_key(cls) and parsed.letter == letter)
        official = official_em(gold, text) or 0
        if outcome != "right":
            assert not robust, (gold, text, parsed)
        elif official and not robust:
            assert parsed.ambiguous, (gold, text, parsed)
            credited["official only, ambiguous"] += 1
        credited[f"{outcome}: robust {robust}, official {official}"] += 1
    assert credited["right: robust 1, official 0"] >= 200  # more lenient: colons, quotes, Latin, one line...
    assert credited["official only, ambiguous"] >= 10  # a second answer that disagrees: never credited
