"""The quality set: a small generated question set with exact gold answers, which a real
model must keep answering as well as the task's baseline does.

Agreement with the reference outputs (:func:`servegym.reference.outputs.agreement`)
measures whether a submission serves the same model; it cannot tell a harmless flip of a
near-tie token from a model that stopped knowing arithmetic. The quality set asks what a
served model must still get right: arithmetic, ordering, copying and dates, each with one
exact answer. It is made by code from a seed (:func:`quality_set`), so nothing is
downloaded and every host asks the same questions. Answers are compared with the gold after
normalisation (:func:`normalise`: case, spacing, quotes, a trailing full stop, a reasoning
block), and a submission's correct answers, over the baseline's, must reach the task's
``accuracy.quality_min_ratio`` (:func:`check_quality`).

A model with random weights (``servegym-tiny``) answers none of it: there the set is off,
and the accuracy gate says so. Pure functions: asking a server is the track's
(:mod:`servegym.tracks.quality`).
"""

from __future__ import annotations

import datetime
import random
import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from servegym.scoring.gates import GateResult

QualityKind = Literal["arithmetic", "ordering", "copying", "dates"]
KINDS: tuple[QualityKind, ...] = ("arithmetic", "ordering", "copying", "dates")
QUALITY_SEED = 20260
"""The seed of the shipped set: every host and every trial asks the same questions."""
QUALITY_SIZE = 64
"""Questions in the shipped set (16 of each kind)."""
MAX_ANSWER_TOKENS = 32
"""An answer's token cap: each gold answer is a few tokens; a model that rambles past this
answers wrongly."""
SYSTEM_PROMPT = "Answer with the answer only: no words, no explanation."


class QualityItem(BaseModel):
    """One question and its one right answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    kind: QualityKind
    prompt: str
    gold: str


def _arithmetic(rng: random.Random) -> tuple[str, str]:
    op = rng.choice(["+", "-", "*"])
    if op == "*":
        a, b = rng.randint(11, 99), rng.randint(3, 19)
        value = a * b
    else:
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        value = a + b if op == "+" else a - b
    return f"What is {a} {op} {b}? Answer with the number only.", str(value)


def _ordering(rng: random.Random) -> tuple[str, str]:
    numbers = rng.sample(range(1, 100), rng.randint(4, 6))
    shown = ", ".join(str(n) for n in numbers)
    gold = ", ".join(str(n) for n in sorted(numbers))
    return (
        f"Sort these numbers from smallest to largest: {shown}. Answer with the sorted "
        "numbers separated by commas only.",
        gold,
    )


def _copying(rng: random.Random) -> tuple[str, str]:
    alphabet = string.ascii_lowercase + string.digits
    parts = ["".join(rng.choice(alphabet) for _ in range(3)) for _ in range(3)]
    text = "-".join(parts)
    return f"Repeat this code exactly: {text}. Answer with the code only.", text


def _dates(rng: random.Random) -> tuple[str, str]:
    start = datetime.date(2001, 1, 1) + datetime.timedelta(days=rng.randint(0, 9000))
    days = rng.randint(2, 40)
    end = start + datetime.timedelta(days=days)
    return (
        f"What date is {days} days after {start.isoformat()}? Answer in YYYY-MM-DD format only.",
        end.isoformat(),
    )


_MAKERS = {"arithmetic": _arithmetic, "ordering": _ordering, "copying": _copying, "dates": _dates}


def quality_set(seed: int = QUALITY_SEED, size: int = QUALITY_SIZE) -> list[QualityItem]:
    """``size`` questions (the kinds in turn), the same for the same seed on any host."""
    if size < 1:
        raise ValueError("a quality set needs at least one question")
    rng = random.Random(seed)
    items = []
    for i in range(size):
        kind = KINDS[i % len(KINDS)]
        prompt, gold = _MAKERS[kind](rng)
        items.append(QualityItem(id=f"q{i:03d}", kind=kind, prompt=prompt, gold=gold))
    return items


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_PREFIX = re.compile(r"^(the )?(final )?answer( is)?\s*[:=]?\s*", re.IGNORECASE)
_SPACES = re.compile(r"\s+")
_COMMA = re.compile(r"\s*,\s*")
_WRAPPERS = "\"'`*"


def normalise(text: str) -> str:
    """An answer as it is compared with the gold: a reasoning block dropped, whitespace
    collapsed, lower case, an ``Answer:`` prefix, wrapping quotes, backticks or bold and a
    trailing full stop removed, spaces around commas dropped."""
    out = _THINK.sub(" ", text)
    out = _SPACES.sub(" ", out).strip().lower()
    out = _PREFIX.sub("", out)
    for _ in range(3):
        out = out.strip().strip(_WRAPPERS).strip().rstrip(".").strip()
    return _COMMA.sub(",", out)


def is_right(item: QualityItem, answer: str | None) -> bool:
    """Exact match after normalisation; no answer (a failed request) is wrong."""
    return answer is not None and normalise(answer) == normalise(item.gold)


class QualityScore(BaseModel):
    """One side's answers to the quality set, graded."""

    model_config = ConfigDict(extra="forbid")

    size: int
    correct: int
    unanswered: int = Field(default=0, description="requests that failed: counted wrong")
    by_kind: dict[str, int] = Field(default_factory=dict, description="correct, per kind")
    wrong: list[str] = Field(
        default_factory=list, description="the first few wrong answers, gold beside them"
    )

    @property
    def share(self) -> float:
        return self.correct / self.size if self.size else 0.0

    def text(self) -> str:
        return f"{self.correct}/{self.size}"


def grade(items: Sequence[QualityItem], answers: Sequence[str | None]) -> QualityScore:
    """Grade ``answers`` (in ``items``' order; ``None``: the request failed)."""
    if len(items) != len(answers):
        raise ValueError(f"{len(answers)} answers to {len(items)} questions")
    right: Counter[str] = Counter()
    wrong: list[str] = []
    for item, answer in zip(items, answers, strict=True):
        if is_right(item, answer):
            right[item.kind] += 1
        elif len(wrong) < 5:
            shown = "no answer" if answer is None else repr(answer.strip()[:60])
            wrong.append(f"{item.id} ({item.kind}): gold {item.gold!r}, got {shown}")
    return QualityScore(
        size=len(items),
        correct=sum(right.values()),
        unanswered=sum(a is None for a in answers),
        by_kind={k: right[k] for k in KINDS if any(i.kind == k for i in items)},
        wrong=wrong,
    )


def check_quality(submission: QualityScore, baseline: QualityScore, min_ratio: float) -> GateResult:
    """The submission's correct answers over the baseline's must reach ``min_ratio``. A
    baseline that answers none cannot be fallen short of: the gate passes, saying so."""
    if baseline.correct == 0:
        return GateResult(
            passed=True,
            detail=f"quality set: the baseline answers none of {baseline.size}: nothing to "
            "fall short of",
            threshold=min_ratio,
        )
    rel = submission.correct / baseline.correct
    ok = rel >= min_ratio - 1e-12
    verb = ">=" if ok else "<"
    return GateResult(
        passed=ok,
        detail=f"quality set: {submission.text()} right, the baseline {baseline.text()} "
        f"({rel:.4f} {verb} the minimum {min_ratio:.4f})",
        value=rel,
        threshold=min_ratio,
        findings=[] if ok else [f"quality set: {w}" for w in submission.wrong],
    )


def combine(agreement: GateResult, quality: GateResult) -> GateResult:
    """The accuracy gate of a track that checks both agreement with the reference and the
    quality set: it passes when every part that was reached passes (a part not reached is
    named in the detail); its value and threshold are those of the first part that fails,
    else of the agreement."""
    parts = [g for g in (agreement, quality) if g.passed is not None]
    if not parts:
        return GateResult(passed=None, detail=f"{agreement.detail}; {quality.detail}")
    passed = all(g.passed for g in parts)
    lead = next((g for g in parts if not g.passed), parts[0])
    agreed = agreement.detail
    if agreement.passed is None:
        agreed = f"agreement with the reference not reached ({agreement.detail})"
    return GateResult(
        passed=passed,
        detail=f"{agreed}; {quality.detail}",
        value=lead.value,
        threshold=lead.threshold,
        findings=[*agreement.findings, *quality.findings],
    )
