"""Length distributions: each kind's statistics, the Pareto tail, clamps, rounding."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from servegym.workloads.distributions import (
    sample_lengths,
    sample_token_lengths,
    scale_length,
    scale_lengths,
)
from servegym.workloads.spec import LengthDistribution as LD

N = 200_000


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_fixed() -> None:
    x = sample_lengths(LD(dist="fixed", value=1000), 50, rng())
    assert x.dtype == np.int64
    assert (x == 1000).all()


def test_uniform_integer_is_inclusive_and_flat() -> None:
    x = sample_lengths(LD(dist="uniform", low=10, high=14), N, rng())
    assert set(np.unique(x).tolist()) == {10, 11, 12, 13, 14}
    freq = np.bincount(x)[10:15] / N
    assert np.allclose(freq, 0.2, atol=0.01)


def test_uniform_float() -> None:
    x = sample_lengths(LD(dist="uniform", low=0.5, high=1.5), N, rng(), integer=False)
    assert x.dtype == np.float64
    assert x.min() >= 0.5 and x.max() < 1.5
    assert abs(x.mean() - 1.0) < 0.01


def test_normal_mean_std() -> None:
    x = sample_lengths(LD(dist="normal", mean=1000, std=100), N, rng())
    assert abs(x.mean() - 1000) < 2
    assert abs(x.std() - 100) < 2


def test_normal_about_1000_plus_minus_20_percent() -> None:
    d = LD(dist="normal", mean=1000, std=100, min=800, max=1200)
    x = sample_lengths(d, N, rng())
    assert x.min() == 800 and x.max() == 1200
    assert abs(np.median(x) - 1000) <= 2


def test_lognormal_median_and_sigma() -> None:
    x = sample_lengths(LD(dist="lognormal", median=200, sigma=0.8), N, rng(), integer=False)
    assert abs(np.median(x) / 200 - 1) < 0.02
    assert abs(np.log(x).std() - 0.8) < 0.01


def test_pareto_scale_and_alpha() -> None:
    x = sample_lengths(LD(dist="pareto", scale=100, alpha=2.5), N, rng(), integer=False)
    assert x.min() >= 100
    # P(X > x) = (x_m / x)^alpha, and the mean is alpha x_m / (alpha - 1).
    assert abs((x > 200).mean() - 0.5**2.5) < 0.005
    assert abs(x.mean() - 2.5 * 100 / 1.5) < 3
    # Hill estimator of the tail index.
    assert abs(1 / np.log(x / 100).mean() - 2.5) < 0.05


def test_pareto_tail_mixture() -> None:
    d = LD(
        dist="lognormal", median=100, sigma=0.3, tail_fraction=0.1, tail_start=2000, tail_alpha=1.5
    )
    x = sample_lengths(d, N, rng(), integer=False)
    in_tail = x >= 2000  # the body essentially never reaches 2000 (20x its median)
    assert abs(in_tail.mean() - 0.1) < 0.005
    tail = x[in_tail]
    assert abs(1 / np.log(tail / 2000).mean() - 1.5) < 0.05
    assert np.percentile(x, 99) > 5 * np.median(x)


def test_clamps_apply_after_the_tail() -> None:
    d = LD(
        dist="lognormal",
        median=100,
        sigma=1.0,
        tail_fraction=0.2,
        tail_start=500,
        tail_alpha=1.1,
        min=20,
        max=3000,
    )
    x = sample_lengths(d, N, rng())
    assert x.min() == 20 and x.max() == 3000
    assert (x == 3000).mean() > 0.01  # the tail piles up at the clamp


def test_integer_lengths_round_half_up_and_are_at_least_one() -> None:
    assert sample_lengths(LD(dist="fixed", value=2.5), 3, rng()).tolist() == [3, 3, 3]
    assert sample_lengths(LD(dist="fixed", value=0), 3, rng()).tolist() == [1, 1, 1]
    x = sample_lengths(LD(dist="normal", mean=0, std=5), 1000, rng())
    assert x.min() == 1


def test_floats_keep_clamps_only() -> None:
    d = LD(dist="lognormal", median=1.0, sigma=2.0, min=0.05, max=30.0)
    x = sample_lengths(d, N, rng(), integer=False)
    assert x.min() == pytest.approx(0.05) and x.max() == pytest.approx(30.0)
    assert not np.all(x == np.round(x))


def test_draws_are_a_prefix_property() -> None:
    d = LD(dist="lognormal", median=100, sigma=1, tail_fraction=0.1, tail_start=500, tail_alpha=2)
    a = sample_lengths(d, 100, rng(3))
    b = sample_lengths(d, 100, rng(3))
    assert (a == b).all()
    assert len(sample_lengths(d, 0, rng())) == 0


def test_scale_rounds_and_keeps_one() -> None:
    x = np.array([1000, 20, 1], dtype=np.int64)
    assert scale_lengths(x, 0.05).tolist() == [50, 1, 1]
    assert scale_lengths(x, 1.0) is x
    assert scale_length(0, 0.5) == 0
    assert scale_length(3, 0.5) == 2
    d = LD(dist="fixed", value=1000)
    assert sample_token_lengths(d, 2, rng(), scale=0.05).tolist() == [50, 50]


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"dist": "normal", "mean": 5}, "needs std"),
        ({"dist": "uniform", "low": 5, "high": 1}, "low <= high"),
        ({"dist": "pareto", "scale": 1, "alpha": 0}, "alpha > 0"),
        ({"dist": "fixed", "value": 1, "tail_fraction": 0.1}, "tail_start"),
        ({"dist": "fixed", "value": 1, "min": 5, "max": 2}, "min must be <= max"),
        ({"dist": "fixed", "value": 1, "bogus": 2}, "Extra inputs"),
    ],
)
def test_bad_parameters(kwargs: dict[str, object], reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        LD.model_validate(kwargs)
