"""The quality set on real servers: asked of both sides of a final evaluation once their
pairs are measured, graded, and folded into the accuracy gate.

The questions, their grading and the gate are :mod:`servegym.scoring.quality`'s; this
module decides whether a task asks them (:meth:`QualityCheck.for_task`: the task's
``accuracy.quality_set``, by default on unless the model has random weights) and asks a
server over its OpenAI-compatible chat API, greedily, one short answer each.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from servegym.engines.models import random_weights
from servegym.scoring import gates
from servegym.scoring.gates import GateResult
from servegym.scoring.quality import (
    MAX_ANSWER_TOKENS,
    SYSTEM_PROMPT,
    QualityItem,
    QualityScore,
    check_quality,
    combine,
    grade,
    quality_set,
)
from servegym.tasks.spec import Task

CONCURRENCY = 8
"""Questions in flight at once on one server."""
TIMEOUT_S = 120.0
"""The longest one answer may take (a short greedy answer takes well under a second)."""


def quality_off_reason(task: Task) -> str | None:
    """Why ``task`` does not ask the quality set, or ``None`` when it does."""
    setting = task.accuracy.quality_set
    if setting is False:
        return "quality set off: the task turns it off (accuracy.quality_set = false)"
    if setting is None and random_weights(task.model):
        return f"quality set off: {task.model} has random weights and answers none of it"
    return None


async def ask_quality_set(
    base_url: str, model: str, items: list[QualityItem], *, timeout_s: float = TIMEOUT_S
) -> list[str | None]:
    """Every item's answer from the server at ``base_url`` (``None`` where the request
    failed), asked greedily through ``/v1/chat/completions``."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(http: aiohttp.ClientSession, item: QualityItem) -> str | None:
        body: dict[str, Any] = {
            "model": model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": item.prompt},
            ],
            "temperature": 0,
            "max_tokens": MAX_ANSWER_TOKENS,
            "stream": False,
            # a reasoning model answers at once (vLLM and SGLang pass it to the template)
            "chat_template_kwargs": {"enable_thinking": False},
        }
        async with gate:
            try:
                async with http.post(url, json=body) as resp:
                    if resp.status != 200:
                        return None
                    data = await resp.json(content_type=None)
                content = data["choices"][0]["message"]["content"]
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError, TypeError):
                return None
        return content if isinstance(content, str) else None

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        return list(await asyncio.gather(*(one(http, item) for item in items)))


@dataclass
class QualityCheck:
    """The quality set of one final evaluation: the questions, each side's score, and the
    gate. ``off``: why the task does not ask it (then :meth:`ask` asks nothing)."""

    items: list[QualityItem]
    min_ratio: float
    off: str | None
    scores: dict[str, QualityScore] = field(default_factory=dict)

    @classmethod
    def for_task(cls, task: Task) -> QualityCheck:
        return cls(quality_set(), task.accuracy.quality_min_ratio, quality_off_reason(task))

    async def ask(self, role: str, base_url: str, model: str) -> None:
        """Ask the side ``role`` (``baseline`` or ``submission``) at ``base_url``."""
        if self.off is not None:
            return
        answers = await ask_quality_set(base_url, model, self.items)
        self.scores[role] = grade(self.items, answers)

    def gate(self, agreement: GateResult) -> GateResult:
        """The accuracy gate: ``agreement`` (with the reference outputs) and the quality
        set; off, the agreement alone, its detail saying the set is off."""
        if self.off is not None:
            return agreement.model_copy(update={"detail": f"{agreement.detail}; {self.off}"})
        sub, base = self.scores.get("submission"), self.scores.get("baseline")
        if sub is None or base is None:
            quality = gates.not_reached("quality set not asked")
        else:
            quality = check_quality(sub, base, self.min_ratio)
        return combine(agreement, quality)
