"""The score of a paired evaluation, and its bootstrap interval.

The final evaluation measures the baseline and the submission in pairs (B, S, S, B, ...),
each run with its own noise. Every pair gives one improvement ratio ``r_i`` (> 1: better;
latency and cost inverted). The score is the **geometric mean of the paired ratios**,
``exp(mean(log r_i))``:

- it treats a 2x gain and a 2x loss symmetrically, and inverting the objective's direction
  inverts the score exactly (a latency ratio and its throughput-like reciprocal agree),
  which a ratio of means does not;
- it is the same aggregate the leaderboard applies across tasks, so scores compose;
- pairing cancels what the two runs of a pair share, and the per-pair ratio keeps a single
  noisy run from moving both numerator and denominator of a global ratio.

The 95% interval is a bootstrap over pairs: resample the ``n`` pairs with replacement
``samples`` times (numpy, seeded, so the interval is reproducible), take each resample's
geometric mean, and read percentiles of those. A plain percentile interval is far too
narrow for the few pairs an evaluation runs (with 5 pairs it covers about 84% instead of
95%, with 3 about 75%), so this is the *expanded* percentile interval (Hesterberg, "What
Teachers Should Know About the Bootstrap", 2015): the percentiles are taken at
``alpha' = 2 (1 - Phi(sqrt(n / (n - 1)) t_{n-1, 1 - alpha/2}))`` instead of ``alpha``, which
corrects both the bootstrap's ``(n - 1) / n`` variance bias and the normal-for-t
substitution, and converges to the plain percentile interval as ``n`` grows. A bootstrap
never reaches past the data, so with ``n`` pairs the interval is at most the pairs'
``[min, max]``, which holds the centre with probability ``1 - 2^(1 - n)``: 75% for 3 pairs,
94% for 5. Tasks should run at least 5 repeats. With one pair the interval is that pair's
ratio on both sides (no spread can be estimated).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from servegym.scoring.objectives import geometric_mean


class PairedScore(BaseModel):
    """A score from paired ratios, with its bootstrap interval."""

    model_config = ConfigDict(extra="forbid")

    score: float
    ci_low: float
    ci_high: float
    level: float = 0.95
    pairs: list[float] = Field(description="the paired improvement ratios, in run order")
    method: str = "geometric mean of paired ratios; expanded percentile bootstrap over pairs"

    @property
    def ci(self) -> tuple[float, float]:
        return (self.ci_low, self.ci_high)


def student_t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``p`` > 0.5).

    Exact for 1 and 2 degrees of freedom; from 3 on, the Cornish-Fisher expansion in the
    normal quantile to the fourth order (within 0.2% of the exact value at df = 3 and
    p <= 0.995, closer for larger df).
    """
    if df < 1:
        raise ValueError("df must be >= 1")
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def expanded_alpha(n: int, level: float) -> float:
    """The tail mass the expanded percentile interval reads for ``n`` pairs (see above)."""
    alpha = 1.0 - level
    t = student_t_quantile(1.0 - alpha / 2.0, n - 1)
    return 2.0 * (1.0 - NormalDist().cdf(math.sqrt(n / (n - 1)) * t))


def bootstrap_geomean_ci(
    ratios: Sequence[float], *, samples: int, seed: int, level: float = 0.95
) -> tuple[float, float]:
    """Expanded percentile-bootstrap interval of the geometric mean of ``ratios`` (> 0)."""
    if not ratios:
        raise ValueError("no ratios")
    if any(not (math.isfinite(r) and r > 0) for r in ratios):
        raise ValueError("ratios must be positive and finite")
    logs = np.log(np.asarray(ratios, dtype=np.float64))
    n = logs.size
    if n == 1:
        v = float(math.exp(logs[0]))
        return v, v
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(samples, n))
    means = np.exp(logs[idx].mean(axis=1))
    tail = expanded_alpha(n, level) / 2.0
    lo, hi = np.percentile(means, [100 * tail, 100 * (1 - tail)])
    return float(lo), float(hi)


def paired_score(
    ratios: Sequence[float], *, samples: int = 2000, seed: int = 0, level: float = 0.95
) -> PairedScore:
    """The geometric mean of paired ratios, with its bootstrap interval."""
    lo, hi = bootstrap_geomean_ci(ratios, samples=samples, seed=seed, level=level)
    score = geometric_mean(list(ratios))
    # Floating point may put the estimate a hair outside a degenerate interval.
    lo, hi = min(lo, score), max(hi, score)
    return PairedScore(score=score, ci_low=lo, ci_high=hi, level=level, pairs=list(ratios))
