"""Arrival schedules: every kind's offsets and gap statistics."""

from __future__ import annotations

import numpy as np
import pytest

from servegym.workloads.arrivals import arrival_offsets
from servegym.workloads.spec import ArrivalSpec

N = 100_000


def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def test_offline_all_at_zero() -> None:
    x = arrival_offsets(ArrivalSpec(kind="offline"), 10, rng())
    assert x is not None and x.tolist() == [0.0] * 10


def test_constant_exact_gaps_from_zero() -> None:
    x = arrival_offsets(ArrivalSpec(kind="constant", rate=4), 5, rng())
    assert x is not None
    assert x.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_poisson_rate_and_exponential_gaps() -> None:
    x = arrival_offsets(ArrivalSpec(kind="poisson", rate=10), N, rng())
    assert x is not None and x[0] == 0.0
    gaps = np.diff(x)
    assert (gaps >= 0).all()
    assert abs(gaps.mean() - 0.1) < 0.002
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.02  # CV of an exponential is 1
    assert abs((N - 1) / x[-1] - 10) < 0.2


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_mean_rate_and_burstiness(burstiness: float) -> None:
    x = arrival_offsets(ArrivalSpec(kind="gamma", rate=5, burstiness=burstiness), N, rng())
    assert x is not None and x[0] == 0.0
    gaps = np.diff(x)
    assert abs(gaps.mean() / 0.2 - 1) < 0.03
    # shape k: coefficient of variation 1/sqrt(k)
    assert abs(gaps.std() / gaps.mean() - 1 / np.sqrt(burstiness)) < 0.05


@pytest.mark.parametrize("kind", ["concurrency", "single_stream"])
def test_closed_loop_has_no_schedule(kind: str) -> None:
    spec = ArrivalSpec.model_validate({"kind": kind, "concurrency": 8})
    assert arrival_offsets(spec, 10, rng()) is None
    assert spec.closed_loop
    assert spec.max_in_flight == (8 if kind == "concurrency" else 1)


def test_trace_is_for_the_trace_module() -> None:
    with pytest.raises(ValueError, match="trace"):
        arrival_offsets(ArrivalSpec(kind="trace"), 3, rng())


def test_empty_and_single() -> None:
    for kind in ("poisson", "constant", "gamma"):
        spec = ArrivalSpec.model_validate({"kind": kind, "rate": 1})
        x0 = arrival_offsets(spec, 0, rng())
        x1 = arrival_offsets(spec, 1, rng())
        assert x0 is not None and len(x0) == 0
        assert x1 is not None and x1.tolist() == [0.0]


def test_open_loop_needs_rate() -> None:
    with pytest.raises(ValueError, match="needs rate"):
        ArrivalSpec(kind="poisson")
    with pytest.raises(ValueError, match="needs concurrency"):
        ArrivalSpec(kind="concurrency")
