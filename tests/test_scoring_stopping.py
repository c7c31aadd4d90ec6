"""Adaptive pairs: when the final evaluation stops adding pairs (servegym.scoring.stopping)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servegym.scoring.score import paired_score
from servegym.scoring.stopping import PairPlan, relative_half_width


def plan(**kw: object) -> PairPlan:
    base: dict[str, object] = {"minimum": 5, "maximum": 20, "target_half_width": 0.05}
    return PairPlan(**(base | kw))  # type: ignore[arg-type]


def test_never_stops_before_the_minimum() -> None:
    p = plan()
    assert all(p.decide([1.0] * n, 1.0) is None for n in range(1, 5))


def test_a_task_without_a_limit_runs_exactly_its_repeats() -> None:
    p = plan(maximum=5)
    assert p.decide([0.5, 2.0, 0.7, 1.9, 1.0], 1.0) == "fixed"


def test_tight_pairs_stop_narrow_and_wide_ones_continue_to_the_limit() -> None:
    p = plan(maximum=8)
    assert p.decide([1.00, 1.01, 0.99, 1.02, 1.00], 10.0) == "narrow"
    wide = [0.8, 1.25, 0.9, 1.2, 1.0]
    assert p.decide(wide, 10.0) is None
    assert p.decide([*wide, 0.85, 1.15], 10.0) is None
    assert p.decide([*wide, 0.85, 1.15, 1.1], 10.0) == "max_repeats"


def test_one_more_pair_that_would_overrun_the_time_stops_it() -> None:
    wide = [0.8, 1.25, 0.9, 1.2, 1.0]
    # 5 pairs took 100 s: a sixth (20 s more) fits 130 s, a seventh does not
    assert plan(time_s=130.0).decide(wide, 100.0) is None
    assert plan(time_s=130.0).decide([*wide, 0.95], 120.0) == "time_budget"


def test_the_decision_reads_the_width_not_where_the_score_lies() -> None:
    """Scaling every ratio (a better or worse submission, same noise) changes nothing."""
    rng = np.random.default_rng(3)
    p = plan(maximum=12)
    for _ in range(50):
        n = int(rng.integers(5, 12))
        ratios = list(np.exp(rng.normal(0, 0.06, n)))
        for factor in (0.7, 1.0, 1.4):
            scaled = [r * factor for r in ratios]
            assert p.decide(scaled, 1.0) == p.decide(ratios, 1.0)


def test_relative_half_width() -> None:
    s = paired_score([0.95, 1.05, 1.0, 0.97, 1.03], samples=500)
    assert relative_half_width(s) == pytest.approx(math.sqrt(s.ci_high / s.ci_low) - 1)
    assert 0 < relative_half_width(s) < 0.06
    assert relative_half_width(paired_score([1.0] * 5, samples=200)) == 0.0
