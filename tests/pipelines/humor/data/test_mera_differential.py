"""Differential test: ``em_mera`` against a line-for-line transcription of MERA's merged Humor scorer.

The transcription below is kept as close to the originals as Python allows and is independent of our module:

* ``benchmark_tasks/humor/utils.py`` of MERA-Evaluation/MERA at b2dc51c1c129b770e427d1489c9cd6da1c77dee7
  (``humor_candidates``, ``process_results``' exact match, ``parse_humor_response`` and its regexes);
* ``lm_eval/api/answer_extraction.py`` of artemorloff/lm-evaluation-harness at
  dd423f199a55eaeb7035fc475a9fd7e5cc335471 (``answer_candidates``, ``best_score``);
* the ``remove_whitespace_and_nones`` filter (``None``/empty -> ``""``, else ``lstrip()``) that humor.yaml runs
  before ``take_first``;
* transformers' ``squad_metrics.normalize_answer`` / ``compute_exact``.

A generated corpus of more than 3,000 answers of many shapes (markers in every case and spacing, markdown,
reasoning, one line, CRLF, ``Ответ:`` tails, bare pairs, marker words inside other words, random token soup)
must be scored identically by both.
"""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence

from punchline.pipelines.humor.data.mera import em_mera, mera_readings
from punchline.pipelines.humor.data.schema import CLASSES, LETTERS

# --- the official scorer, transcribed ---------------------------------------------------------------------


def official_remove_whitespace_and_nones(inst: list[str | None]) -> list[str]:
    filtered_resp = []
    for resp in inst:
        if not resp:
            resp = ""
        else:
            resp = resp.lstrip()
        filtered_resp.append(resp)
    return filtered_resp


ANSWER_MARKER = "Ответ:"


def official_answer_candidates(response: str | None, marker: str = ANSWER_MARKER) -> list[str]:
    full = (response or "").strip()
    if not full or marker not in full:
        return [full]
    tail = full.rsplit(marker, 1)[-1].strip()
    if not tail or tail == full:
        return [full]
    return [full, tail]


def official_best_score(score_fn: Callable[[str], float], candidates: Sequence[str]) -> float:
    return max((score_fn(c) for c in candidates), default=0.0)


_ANSWER_RE = re.compile(r"ОТВЕТ\s*[:\-—]?\s*(.+)", re.IGNORECASE)
_SOLUTION_RE = re.compile(r"РЕШЕНИЕ\s*[:\-—]?\s*([АБВГ])", re.IGNORECASE)
_FINAL_RE = re.compile(r"^\s*(.+?)\s*,\s*([АБВГ])\s*\.?\s*$", re.DOTALL)


def official_parse_humor_response(resp: str) -> str:
    if not resp or not str(resp).strip():
        return ""

    text = str(resp)

    answer_matches = []
    for line in text.split("\n"):
        m = _ANSWER_RE.search(line)
        if m:
            candidate = m.group(1).strip(" \t:—-")
            candidate = re.split(r"РЕШЕНИЕ", candidate, flags=re.IGNORECASE)[0]
            candidate = candidate.strip(" \t:—-,.")
            if candidate:
                answer_matches.append(candidate)

    solution_matches = [m.group(1).upper() for m in _SOLUTION_RE.finditer(text)]

    if answer_matches or solution_matches:
        answer = answer_matches[-1] if answer_matches else ""
        solution = solution_matches[-1] if solution_matches else ""
        return f"{answer},{solution}"

    final = _FINAL_RE.match(text.strip())
    if final:
        return f"{final.group(1).strip()},{final.group(2).upper()}"

    return text.strip()


def official_humor_candidates(response: str) -> list[str]:
    candidates = official_answer_candidates(response)
    parsed = official_parse_humor_response(response)
    if parsed and parsed not in candidates:
        candidates.append(parsed)
    return candidates


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


def official_exact_match(doc: dict[str, str], raw: str | None) -> float:
    """``process_results``' exact match after the filter chain (``remove_whitespace_and_nones``, ``take_first``)."""
    results = official_remove_whitespace_and_nones([raw])
    gold = doc.get("outputs") or ""
    if not gold:
        return 0
    candidates = official_humor_candidates(results[0] if results else "")
    return official_best_score(lambda c: official_compute_exact(gold, c), candidates)


# --- the corpus --------------------------------------------------------------------------------------------

ANSWER_MARKERS = [
    "ОТВЕТ ",
    "ОТВЕТ: ",
    "ОТВЕТ:",
    "Ответ: ",
    "Ответ:",
    "ответ: ",
    "ответ ",
    "**ОТВЕТ:** ",
    "**ОТВЕТ** ",
    "ОТВЕТ\t",
    "ОТВЕТ:\u00a0",
    "ОТВЕТ — ",
    "ОТВЕТ - ",
    "Ответ —",
    "ОТВЕТ  ",
    "### Ответ: ",
    "",
]
SOLUTION_MARKERS = [
    "РЕШЕНИЕ ",
    "РЕШЕНИЕ: ",
    "РЕШЕНИЕ:",
    "Решение: ",
    "решение ",
    "**РЕШЕНИЕ:** ",
    "**РЕШЕНИЕ** ",
    "РЕШЕНИЕ\t",
    "РЕШЕНИЕ:\u00a0",
    "РЕШЕНИЕ — ",
    "РЕШЕНИЕ  ",
    "",
]
TRAILING = ["", "", "", " ", "\t", "\u00a0", "\r", ".", "!", ",", " ."]
LEADING = ["", "", "", " ", "\t", "- ", "> "]
NEWLINES = ["\n", "\n", "\r\n", "\n\n", "\n \n", " "]
PREFIXES = [
    "",
    "",
    "Разберём текст: концовка неожиданная.\n",
    "Ответ: подумаем.\n",
    "Безответный вопрос.\n",
    "Ответственный подход: сначала класс.\n",
    "Решение в том, что текст смешной.\n",
    "  \n",
    "ОТВЕТ\n",
]
SUFFIXES = [
    "",
    "",
    "\n",
    "\r\n",
    "\nПояснение: текст похож.",
    "\n\nОТВЕТ ирония\nРЕШЕНИЕ А",
    "\nОтвет: ирония,Б",
    "\nРешение окончательное.",
    " (уверен)",
]
OUTCOMES = ("right", "wrong class", "wrong letter", "both wrong")
SOUP = [
    "ОТВЕТ",
    "ответ",
    "Ответ:",
    "РЕШЕНИЕ",
    "решение",
    ":",
    "-",
    "—",
    ",",
    ".",
    " ",
    " ",
    "\n",
    "\r\n",
    "\t",
    "\u00a0",
    "А",
    "Б",
    "в",
    "г",
    "ирония",
    "игра слов",
    "the",
    "**",
    "(",
    ")",
]


def _class_form(rng: random.Random, cls: str) -> str:
    form = rng.choice(["as is"] * 5 + ["upper", "title", "quoted", "bold", "dot", "the", "double space", "nbsp"])
    return {
        "upper": cls.upper(),
        "title": cls[:1].upper() + cls[1:],
        "quoted": f"«{cls}»",
        "bold": f"**{cls}**",
        "dot": f"{cls}.",
        "the": f"the {cls}",
        "double space": cls.replace(" ", "  "),
        "nbsp": cls.replace(" ", "\u00a0"),
    }.get(form, cls)


def _letter_form(rng: random.Random, letter: str) -> str:
    form = rng.choice(["as is"] * 5 + ["lower", "dot", "paren", "round", "latin", "bold", "option"])
    return {
        "lower": letter.lower(),
        "dot": f"{letter}.",
        "paren": f"{letter})",
        "round": f"({letter})",
        "latin": {"А": "A", "Б": "B", "В": "C", "Г": "D"}[letter],
        "bold": f"**{letter}**",
        "option": f"вариант {letter}",
    }.get(form, letter)


def _answer(rng: random.Random, cls: str, letter: str) -> str:
    shape = rng.choice(
        ["two lines"] * 6
        + ["one line", "one line", "pair", "pair spaced", "bare lines", "answer only", "solution only"]
        + ["reversed", "ответ tail", "empty", "soup", "soup"]
    )
    c, ltr = _class_form(rng, cls), _letter_form(rng, letter)
    if shape == "empty":
        return rng.choice(["", " ", "\n", "\t \n"])
    if shape == "soup":
        return "".join(rng.choice(SOUP) for _ in range(rng.randrange(1, 14)))
    if shape == "pair":
        return f"{rng.choice(LEADING)}{c},{ltr}{rng.choice(TRAILING)}"
    if shape == "pair spaced":
        return c + " , " + ltr + rng.choice(["", ".", " .", "\n"])
    if shape == "bare lines":
        return f"{c}{rng.choice(NEWLINES)}{ltr}"
    if shape == "ответ tail":
        return rng.choice(PREFIXES) + "Ответ:" + rng.choice(["", " ", "  "]) + f"{c},{ltr}" + rng.choice(TRAILING)
    if shape == "one line":
        text = f"{rng.choice(ANSWER_MARKERS)}{c}{rng.choice([' ', ', ', '; '])}{rng.choice(SOLUTION_MARKERS)}{ltr}"
        return rng.choice(PREFIXES) + text + rng.choice(TRAILING)
    first = f"{rng.choice(LEADING)}{rng.choice(ANSWER_MARKERS)}{c}{rng.choice(TRAILING)}"
    second = f"{rng.choice(LEADING)}{rng.choice(SOLUTION_MARKERS)}{ltr}{rng.choice(TRAILING)}"
    if shape == "answer only":
        second = ""
    elif shape == "solution only":
        first = ""
    elif shape == "reversed":
        first, second = second, first
    return rng.choice(PREFIXES) + first + rng.choice(NEWLINES) + second + rng.choice(SUFFIXES)


def corpus(n: int = 3600, seed: int = 18) -> list[tuple[str, str, str]]:
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
    assert len(answers) >= 3000
    assert len({t for _, _, t in answers}) >= 2500  # many shapes, not one shape repeated
    disagreements = []
    official_scores: Counter[str] = Counter()
    for outcome, gold, text in answers:
        expected = official_exact_match({"outputs": gold}, text)
        official_scores[f"{outcome}: {expected}"] += 1
        if em_mera(gold, text) != expected:
            disagreements.append((gold, text, expected))
    assert not disagreements, f"{len(disagreements)} of {len(answers)} disagree, e.g. {disagreements[:5]}"
    # the corpus exercises both outcomes for right answers, and credits wrong ones only by MERA's own faults
    assert official_scores["right: 1"] >= 150 and official_scores["right: 0"] >= 300


def test_readings_are_the_official_candidates() -> None:
    for _, _, text in corpus(n=1200, seed=5):
        filtered = official_remove_whitespace_and_nones([text])[0]
        assert mera_readings(text) == official_humor_candidates(filtered), text


def test_corpus_covers_the_cases_the_draft_reading_got_wrong() -> None:
    """The shapes where the draft reading and the merged one differ are all in the corpus, on both sides."""
    hits: Counter[str] = Counter()
    for outcome, gold, text in corpus():
        if outcome != "right":
            continue
        score = official_exact_match({"outputs": gold}, text)
        for name, present in [
            ("colon marker", "ОТВЕТ: " in text),
            ("bold marker", "**ОТВЕТ:**" in text),
            ("lower marker", "ответ: " in text),
            ("tab or nbsp", "ОТВЕТ\t" in text or "\u00a0" in text),
            ("one line", "\n" not in text.strip() and "ОТВЕТ" in text),
            ("reasoning first", text.startswith("Разберём")),
            ("crlf", "\r\n" in text),
            ("bold letter", "**" in text and "РЕШЕНИЕ" in text),
            ("paren letter", "(" in text),
        ]:
            if present:
                hits[f"{name}: {score}"] += 1
    for name in ("colon marker", "bold marker", "lower marker", "tab or nbsp", "one line", "reasoning first", "crlf"):
        assert hits[f"{name}: 1"] >= 5, (name, hits)
    for name in ("crlf", "bold letter", "paren letter"):
        assert hits[f"{name}: 0"] >= 5, (name, hits)


def test_examples_from_the_issue() -> None:
    gold = "ирония,Б"
    for credited in ["ОТВЕТ: ирония\nРЕШЕНИЕ: Б", "**ОТВЕТ:** ирония,Б", "ответ: ирония\nрешение: б"]:
        assert em_mera(gold, credited) == 1, credited
    for credited in ["ОТВЕТ\tирония\nРЕШЕНИЕ Б", "ОТВЕТ:\u00a0ирония РЕШЕНИЕ Б", "Думаю.\nОТВЕТ ирония\nРЕШЕНИЕ Б"]:
        assert em_mera(gold, credited) == 1, credited
    assert em_mera(gold, "ирония,Б") == 1
    for zero in ["ОТВЕТ ирония\r\nРЕШЕНИЕ Б", "ирония\nРЕШЕНИЕ Б", "ОТВЕТ ирония\nРЕШЕНИЕ **Б**", "ОТВЕТ ирония (Б)"]:
        assert em_mera(gold, zero) == 0, zero
    assert em_mera("", "ирония,Б") == 0
