"""When a final evaluation stops adding pairs.

A task runs at least ``repeats`` pairs. Where it allows more (``[evaluation] max_repeats``),
the evaluation adds a pair at a time until the score's interval is narrow enough
(``target_half_width``), the pair limit is reached, or one more pair would overrun the
wall seconds the pairs may take (``pairs_time_s``), and records which of these stopped it.
Real servers on a shared host are noisy; a fixed pair count is either too few for a noisy
task or wasted on a quiet one.

The rule looks only at the interval's *width*, never at where the score lies, so it cannot
stop early on a lucky draw: a width computed from the pairs' spread does not depend on
whether they lie above or below 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from servegym.scoring.score import PairedScore, paired_score

StopReason = Literal["fixed", "narrow", "max_repeats", "time_budget"]
"""``fixed``: the task runs exactly ``repeats`` pairs; ``narrow``: the interval reached the
target half-width; ``max_repeats``: the pair limit was reached first; ``time_budget``: one
more pair would have overrun the pairs' wall seconds."""


def relative_half_width(score: PairedScore) -> float:
    """Half the interval's width relative to the score, in log terms:
    ``sqrt(high / low) - 1`` (0.05 for ``[0.952, 1.050]``); ``inf`` for a degenerate one."""
    if score.ci_low <= 0 or not math.isfinite(score.ci_high):
        return math.inf
    return math.sqrt(score.ci_high / score.ci_low) - 1.0


@dataclass(frozen=True)
class PairPlan:
    """How many pairs an evaluation runs: at least ``minimum``, at most ``maximum``."""

    minimum: int
    maximum: int
    target_half_width: float
    time_s: float | None = None
    bootstrap_samples: int = 2000
    seed: int = 0

    def decide(self, ratios: Sequence[float], elapsed_s: float) -> StopReason | None:
        """Stop now (and why), or None for one more pair; ``ratios``: the pairs so far,
        ``elapsed_s``: the wall seconds they took."""
        n = len(ratios)
        if n < self.minimum:
            return None
        if self.maximum <= self.minimum:
            return "fixed"
        score = paired_score(ratios, samples=self.bootstrap_samples, seed=self.seed)
        if relative_half_width(score) <= self.target_half_width:
            return "narrow"
        if n >= self.maximum:
            return "max_repeats"
        if self.time_s is not None and elapsed_s + elapsed_s / n > self.time_s:
            return "time_budget"
        return None
