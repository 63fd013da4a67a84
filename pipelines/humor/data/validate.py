"""Checks of a Humor data file before it is run or scored.

Errors (non-zero exit): duplicate ids, an instruction missing a placeholder, an ``outputs`` not of the
form ``class,letter`` with a known class and a letter А-Г, an option identical to the main text.
Warnings: empty ``outputs`` (the private test file has no answers), empty texts, two identical options.
The letter distribution is tested against uniform with Pearson's chi-square (3 degrees of freedom).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Literal

import msgspec

from punchline.pipelines.humor.data.prompts import missing_placeholders
from punchline.pipelines.humor.data.schema import CLASSES, LETTERS, OPTION_FIELDS, HumorItem, split_output


class Issue(msgspec.Struct):
    severity: Literal["error", "warning"]
    index: int
    id: int
    field: str
    message: str


class ValidationReport(msgspec.Struct, kw_only=True):
    n: int
    n_labeled: int
    per_class: dict[str, int]
    letters: dict[str, int]
    chi2: float | None  # letters vs uniform; None without labeled items
    chi2_p_value: float | None
    duplicate_ids: list[int]
    errors: list[Issue]
    warnings: list[Issue]

    @property
    def ok(self) -> bool:
        return not self.errors


def chi2_sf_3dof(x: float) -> float:
    """Survival function of chi-square with 3 degrees of freedom (closed form)."""
    if x <= 0:
        return 1.0
    return math.erfc(math.sqrt(x / 2)) + math.sqrt(2 * x / math.pi) * math.exp(-x / 2)


def chi2_uniform(counts: Sequence[int]) -> tuple[float, float] | None:
    """Pearson's statistic of 4 counts against a uniform split, and its p-value (3 dof)."""
    total = sum(counts)
    if total == 0:
        return None
    expected = total / len(counts)
    stat = sum((c - expected) ** 2 / expected for c in counts)
    return stat, chi2_sf_3dof(stat)


def validate_items(items: Sequence[HumorItem]) -> ValidationReport:
    errors: list[Issue] = []
    warnings: list[Issue] = []
    per_class = dict.fromkeys(CLASSES, 0)
    letters = dict.fromkeys(LETTERS, 0)
    ids = Counter(item.id for item in items)
    duplicates = sorted(i for i, c in ids.items() if c > 1)
    seen: set[int] = set()
    n_labeled = 0
    for index, item in enumerate(items):

        def err(field: str, message: str, *, index: int = index, item: HumorItem = item) -> None:
            errors.append(Issue("error", index, item.id, field, message))

        def warn(field: str, message: str, *, index: int = index, item: HumorItem = item) -> None:
            warnings.append(Issue("warning", index, item.id, field, message))

        if item.id in seen:
            err("meta.id", f"duplicate id {item.id}")
        seen.add(item.id)
        missing = missing_placeholders(item.instruction)
        if missing:
            err("instruction", "missing placeholder(s) " + ", ".join("{" + m + "}" for m in missing))
        if not item.outputs:
            warn("outputs", "no reference answer")
        else:
            ref = split_output(item.outputs)
            if ref is None:
                err("outputs", f"{item.outputs!r} is not 'class,letter' with one of the 12 classes and А-Г")
            else:
                n_labeled += 1
                per_class[ref[0]] += 1
                letters[ref[1]] += 1
        main = item.inputs.main_text.strip()
        if not main:
            warn("inputs.main_text", "empty text")
        options = [getattr(item.inputs, f).strip() for f in OPTION_FIELDS]
        for field, letter, text in zip(OPTION_FIELDS, LETTERS, options, strict=True):
            if not text:
                warn(f"inputs.{field}", "empty text")
            elif text == main:
                err(f"inputs.{field}", f"option {letter} is identical to the main text")
        if len({t for t in options if t}) < len([t for t in options if t]):
            warn("inputs", "two options are identical")
        if not item.inputs.context.strip():
            warn("inputs.context", "empty context")
    chi = chi2_uniform(list(letters.values()))
    return ValidationReport(
        n=len(items),
        n_labeled=n_labeled,
        per_class=per_class,
        letters=letters,
        chi2=chi[0] if chi else None,
        chi2_p_value=chi[1] if chi else None,
        duplicate_ids=duplicates,
        errors=errors,
        warnings=warnings,
    )
