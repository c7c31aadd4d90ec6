"""The paired score and its bootstrap interval; the gates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servegym.engines.config import ServingConfig
from servegym.scoring.gates import check_accuracy, check_config, check_launch, check_outputs, merge
from servegym.scoring.objectives import IntegrityCounts
from servegym.scoring.score import (
    bootstrap_geomean_ci,
    expanded_alpha,
    paired_score,
    student_t_quantile,
)


def test_score_is_the_geometric_mean_of_paired_ratios() -> None:
    s = paired_score([1.0, 4.0], samples=200, seed=1)
    assert s.score == pytest.approx(2.0)
    assert s.ci_low <= s.score <= s.ci_high
    assert s.pairs == [1.0, 4.0]


def test_inverting_every_ratio_inverts_the_score() -> None:
    ratios = [1.2, 0.9, 1.5, 1.1]
    a = paired_score(ratios, samples=300, seed=3)
    b = paired_score([1 / r for r in ratios], samples=300, seed=3)
    assert a.score * b.score == pytest.approx(1.0)
    assert a.ci_low * b.ci_high == pytest.approx(1.0)


def test_one_pair_gives_a_degenerate_interval() -> None:
    s = paired_score([1.3], samples=200, seed=0)
    assert s.ci == (1.3, 1.3) and s.score == pytest.approx(1.3)


def test_bootstrap_is_seeded() -> None:
    r = [1.1, 1.3, 0.95, 1.2, 1.05]
    assert bootstrap_geomean_ci(r, samples=500, seed=7) == bootstrap_geomean_ci(
        r, samples=500, seed=7
    )
    assert bootstrap_geomean_ci(r, samples=500, seed=7) != bootstrap_geomean_ci(
        r, samples=500, seed=8
    )


def test_bad_ratios_raise() -> None:
    with pytest.raises(ValueError):
        bootstrap_geomean_ci([], samples=100, seed=0)
    with pytest.raises(ValueError):
        bootstrap_geomean_ci([1.0, 0.0], samples=100, seed=0)
    with pytest.raises(ValueError):
        bootstrap_geomean_ci([1.0, math.inf], samples=100, seed=0)


@pytest.mark.parametrize("pairs", [5, 15])
def test_paired_bootstrap_interval_covers_the_true_ratio(pairs: int) -> None:
    """Synthetic paired runs: baseline and submission each with 3% lognormal noise around
    true values whose ratio is 1.3. The 95% interval must contain 1.3 in about 95% of
    trials, even with as few pairs as an evaluation runs (a plain percentile bootstrap
    covers ~84% with 5 pairs)."""
    rng = np.random.default_rng(2024 + pairs)
    true = 1.3
    covered = 0
    trials = 400
    for t in range(trials):
        base = 100.0 * np.exp(rng.normal(0, 0.03, pairs))
        sub = 130.0 * np.exp(rng.normal(0, 0.03, pairs))
        s = paired_score(list(sub / base), samples=500, seed=t)
        covered += s.ci_low <= true <= s.ci_high
    assert 0.9 <= covered / trials <= 0.995
    if pairs == 15:  # and not vacuous: narrow around the truth
        assert 1.25 < s.score < 1.35 and s.ci_high - s.ci_low < 0.1


def test_three_pairs_reach_at_most_their_range() -> None:
    """A bootstrap cannot reach beyond the data: with n pairs the interval is at most
    [min, max], which holds the centre with probability 1 - 2^(1-n) (75% for 3 pairs)."""
    s = paired_score([1.1, 1.2, 1.4], samples=2000, seed=1)
    assert s.ci_low >= 1.1 - 1e-12 and s.ci_high <= 1.4 + 1e-12
    assert s.ci_low == pytest.approx(1.1) and s.ci_high == pytest.approx(1.4)


def test_student_t_quantiles_and_the_expansion() -> None:
    exact = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 29: 2.045}
    for df, t in exact.items():
        assert student_t_quantile(0.975, df) == pytest.approx(t, rel=2e-3)
    assert student_t_quantile(0.995, 4) == pytest.approx(4.604, rel=3e-3)
    alphas = [expanded_alpha(n, 0.95) for n in (2, 3, 5, 10, 100, 10_000)]
    assert alphas == sorted(alphas) and alphas[0] < 1e-6
    assert alphas[-1] == pytest.approx(0.05, rel=1e-2)


def test_accuracy_gate() -> None:
    assert check_accuracy(0.997, 1.0, 0.99).passed
    fail = check_accuracy(0.97, 1.0, 0.99)
    assert fail.passed is False and fail.value == pytest.approx(0.97)
    assert fail.threshold == 0.99 and "<" in fail.detail
    assert check_accuracy(0.98, 0.98, 1.0).passed  # relative to the baseline's own accuracy
    zero = check_accuracy(0.0, 0.0, 0.99)  # a baseline with no accuracy cannot be undercut
    assert zero.passed and "0" in zero.detail


def test_config_gate_revalidates() -> None:
    assert check_config(ServingConfig(max_num_seqs=4), ["sim"]).passed
    forged = ServingConfig.model_construct(max_num_seqs=-3)
    bad = check_config(forged, ["sim"])
    assert bad.passed is False and "max_num_seqs" in bad.detail
    mutated = ServingConfig()
    mutated.gpu_memory_utilization = 7.0  # no validate_assignment: the harness catches it
    assert check_config(mutated, ["sim"]).passed is False
    assert check_config({"max_num_seqs": 4}, ["sim"]).passed is False


def test_output_gate_and_merge() -> None:
    clean = check_outputs(IntegrityCounts(requests=10))
    assert clean.passed and clean.detail == "10 requests completed with their forced output length"
    # a cpu-track pipeline counts questions answered end to end (no forced lengths there)
    questions = IntegrityCounts(requests=6, unit="questions")
    summed = questions.add(IntegrityCounts(requests=4, unit="questions"))
    assert summed.unit == "questions" and IntegrityCounts().add(questions).unit == "questions"
    assert check_outputs(summed).detail == "10 questions answered"
    lost = check_outputs(IntegrityCounts(requests=6, failed=1, unit="questions"))
    assert lost.passed is False and lost.detail == "1 of 6 scoring questions did not complete"
    failed = check_outputs(IntegrityCounts(requests=10, failed=2))
    assert failed.passed is False and "2 of 10" in failed.detail
    short = check_outputs(IntegrityCounts(requests=10, length_mismatches=1))
    assert short.passed is False and "forced" in short.detail
    assert check_outputs(IntegrityCounts()).passed is False
    # Requests the baseline cannot serve either (prompts past the context) are excused.
    base = IntegrityCounts(requests=10, failed=2)
    assert check_outputs(IntegrityCounts(requests=10, failed=2), base).passed
    worse = check_outputs(IntegrityCounts(requests=10, failed=3), base)
    assert worse.passed is False and "baseline failed 2 of 10" in worse.detail
    cfg = check_config(ServingConfig(), ["sim"])
    assert merge(cfg, clean).passed and merge(cfg, failed).passed is False
    assert merge(cfg, None) is cfg
    assert check_launch(None).passed and check_launch("ValueError: boom\nmore").detail == (
        "ValueError: boom"
    )
