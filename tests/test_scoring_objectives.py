"""Objectives: directions and ratio math, the max-rate search, measurements on the simulator."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from servegym.engines.config import ServingConfig
from servegym.engines.sim.launch import LaunchedEngine, launch
from servegym.scoring.metrics import Metrics, Percentiles
from servegym.scoring.objectives import (
    RATIO_CAP,
    RATIO_FLOOR,
    geometric_mean,
    improvement,
    measurement_improvement,
    plain_value,
    ratio,
    search_max_rate,
)
from servegym.tasks.loader import LoadedTask, load_task, workload_spec
from servegym.tasks.spec import ObjectiveSpec
from servegym.tracks.sim_measure import at_rate, measure_objective, run_workload
from servegym.workloads.generate import materialise

TASKS = Path(__file__).parent / "data" / "tasks"


def obj(kind: str, **kw: object) -> ObjectiveSpec:
    return ObjectiveSpec.model_validate({"kind": kind, **kw})


# --------------------------------------------------------------------------- ratios


@pytest.mark.parametrize(
    ("kind", "higher"),
    [
        ("output_throughput", True),
        ("goodput", True),
        ("max_rate_at_sla", True),
        ("ttft", False),
        ("tpot", False),
        ("itl", False),
        ("e2e", False),
        ("turn_latency", False),
        ("cost_at_sla", False),
    ],
)
def test_directions(kind: str, higher: bool) -> None:
    o = obj(kind)
    assert o.higher_is_better is higher
    better, worse = (200.0, 100.0) if higher else (100.0, 200.0)
    assert improvement(o, worse, better) == pytest.approx(2.0)
    assert improvement(o, better, worse) == pytest.approx(0.5)
    assert improvement(o, 123.0, 123.0) == 1.0


def test_latency_ratio_is_inverted_and_symmetric() -> None:
    o = obj("ttft", statistic="p99")
    assert improvement(o, 300.0, 100.0) == pytest.approx(3.0)
    assert improvement(o, 100.0, 300.0) == pytest.approx(1 / 3)


def test_missing_zero_and_nonfinite_values() -> None:
    assert ratio(True, 100.0, 0.0) == RATIO_FLOOR  # throughput collapsed
    assert ratio(False, 100.0, None) == RATIO_FLOOR  # latency infeasible
    assert ratio(True, 0.0, 5.0) == RATIO_CAP  # broken baseline, real submission
    assert ratio(True, None, None) == 1.0
    assert ratio(False, 0.0, 0.0) == 1.0
    assert ratio(True, 1.0, math.inf) == RATIO_FLOOR
    assert ratio(True, 1.0, 1e9) == RATIO_CAP  # clamped
    assert ratio(True, 1e9, 1.0) == RATIO_FLOOR


def test_composite_is_the_geometric_mean_of_component_ratios() -> None:
    o = obj("composite", components=[{"kind": "output_throughput"}, {"kind": "ttft"}])
    assert o.higher_is_better
    # throughput x2, TTFT 2x worse -> 1.0; throughput x4, TTFT x1 -> 2.0
    assert improvement(o, [100.0, 50.0], [200.0, 100.0]) == pytest.approx(1.0)
    assert improvement(o, [100.0, 50.0], [400.0, 50.0]) == pytest.approx(2.0)
    assert improvement(o, [100.0, 50.0], [100.0, None]) == pytest.approx(math.sqrt(RATIO_FLOOR))
    with pytest.raises(TypeError):
        improvement(o, 1.0, 2.0)
    with pytest.raises(ValueError):
        improvement(o, [1.0], [2.0])
    with pytest.raises(TypeError):
        improvement(obj("ttft"), [1.0], [2.0])


def test_geometric_mean() -> None:
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert geometric_mean([]) == 1.0


def test_latency_of_an_empty_run_is_infeasible_not_zero() -> None:
    empty = Percentiles()
    metrics = Metrics.model_validate(
        {
            "ttft_ms": empty,
            "tpot_ms": empty,
            "itl_ms": empty,
            "e2e_ms": empty,
            "request_throughput": 0.0,
            "output_throughput": 0.0,
            "total_token_throughput": 0.0,
            "goodput": None,
            "sla_attainment": None,
            "cost_per_mtok": None,
            "completed": 0,
            "failed": 5,
            "duration_s": 1.0,
            "loadgen": {},
        }
    )
    assert plain_value(obj("ttft"), metrics) is None
    assert plain_value(obj("turn_latency"), metrics) is None
    assert plain_value(obj("output_throughput"), metrics) == 0.0
    assert plain_value(obj("goodput"), metrics) == 0.0


# --------------------------------------------------------------------------- rate search


def step(threshold: float) -> tuple[list[float], object]:
    calls: list[float] = []

    def attainment(rate: float) -> float:
        calls.append(rate)
        return 1.0 if rate <= threshold else 0.5

    return calls, attainment


@pytest.mark.parametrize("threshold", [0.37, 3.3, 37.3, 150.0])
@pytest.mark.parametrize("start", [None, 1.0, 100.0])
def test_search_finds_the_threshold_of_a_monotone_function(
    threshold: float, start: float | None
) -> None:
    def attainment(rate: float) -> float:
        return max(0.0, 1.0 - 0.02 * max(rate - threshold, 0.0) - 0.2 * (rate > threshold))

    found = search_max_rate(
        attainment, rate_min=0.1, rate_max=200.0, target=0.9, tolerance=0.05, start=start
    )
    assert found.rate is not None
    assert threshold / 1.05 <= found.rate <= threshold
    assert len(found.probes) < 25
    assert not found.truncated
    # Every passing probe is at or below the threshold, every failing one above it.
    assert all(p.passed == (p.rate <= threshold) for p in found.probes)


def test_search_edges() -> None:
    ok = search_max_rate(lambda r: 1.0, rate_min=1.0, rate_max=64.0, target=0.9, tolerance=0.05)
    assert ok.rate == 64.0
    never = search_max_rate(lambda r: 0.0, rate_min=1.0, rate_max=64.0, target=0.9, tolerance=0.05)
    assert never.rate is None
    assert min(p.rate for p in never.probes) == 1.0
    with pytest.raises(ValueError):
        search_max_rate(lambda r: 1.0, rate_min=2.0, rate_max=1.0, target=0.9, tolerance=0.05)


def test_search_probes_each_rate_once_and_stops_when_told() -> None:
    seen: list[float] = []

    def attainment(rate: float) -> float:
        seen.append(rate)
        return 1.0 if rate <= 10.0 else 0.0

    full = search_max_rate(attainment, rate_min=0.1, rate_max=1000.0, target=0.9, tolerance=0.01)
    assert len(seen) == len(set(seen)) == len(full.probes)
    seen.clear()
    budget = iter(range(4))
    cut = search_max_rate(
        attainment,
        rate_min=0.1,
        rate_max=1000.0,
        target=0.9,
        tolerance=0.01,
        should_stop=lambda: next(budget, None) is None,
    )
    assert cut.truncated and len(cut.probes) == 5
    assert cut.rate is not None and cut.rate <= 10.0
    assert cut.rate == max(p.rate for p in cut.probes if p.passed)


# --------------------------------------------------------------------------- on the simulator


@pytest.fixture(scope="module")
def maxrate() -> LoadedTask:
    return load_task("tiny-maxrate", TASKS)


def engine_for(loaded: LoadedTask, config: ServingConfig) -> LaunchedEngine:
    return launch(loaded.task.model, loaded.task.hardware, config)


def test_max_rate_on_the_sim_meets_the_sla_just_below_a_failing_rate(maxrate: LoadedTask) -> None:
    spec, _ = workload_spec(maxrate)
    m = measure_objective(maxrate.task, engine_for(maxrate, ServingConfig()), spec, 5, 11)
    target = maxrate.task.objective.attainment_target
    assert m.feasible and m.value is not None and m.value == m.rate
    assert maxrate.task.objective.rate_min < m.value < maxrate.task.objective.rate_max
    assert m.metrics is not None and m.metrics.sla_attainment is not None
    assert m.metrics.sla_attainment >= target
    failing = [p.rate for p in m.rate_probes if not p.passed]
    assert failing and min(failing) / m.value <= 1.0 + maxrate.task.objective.rate_tolerance + 1e-9
    assert m.runs == len(m.rate_probes) and m.sim_seconds > 0
    # The measured run was Poisson at that rate (throughput over arrivals plus the drain).
    assert m.value / 3 < m.metrics.request_throughput < m.value * 1.3
    # Same seeds, same answer.
    again = measure_objective(maxrate.task, engine_for(maxrate, ServingConfig()), spec, 5, 11)
    assert again.value == m.value


def test_max_rate_orders_configs_and_reports_infeasible_as_zero(maxrate: LoadedTask) -> None:
    spec, _ = workload_spec(maxrate)
    task = maxrate.task
    base = measure_objective(task, engine_for(maxrate, ServingConfig()), spec, 5, 11)
    fast = measure_objective(
        task, engine_for(maxrate, ServingConfig(quantization="fp8")), spec, 5, 11
    )
    assert fast.value is not None and base.value is not None and fast.value > base.value
    # Both rates sit near what vLLM's API server takes (~10 ms per request, queueing into the
    # 60 ms TTFT SLA), so fp8's halved weight read buys less rate than its TPOT headroom.
    assert measurement_improvement(task.objective, base, fast) > 1.05
    strict = obj("max_rate_at_sla", rate_min=5.0, rate_max=1000.0)
    starved = measure_objective(
        task, engine_for(maxrate, ServingConfig(max_num_seqs=1)), spec, 5, 11, objective=strict
    )
    assert not starved.feasible and starved.value == 0.0 and starved.rate == 5.0
    assert measurement_improvement(strict, base, starved) == RATIO_FLOOR


def test_cost_at_sla_is_price_over_output_rate() -> None:
    loaded = load_task("tiny-cost", TASKS)
    spec, _ = workload_spec(loaded)
    one = measure_objective(loaded.task, engine_for(loaded, ServingConfig()), spec, 5, 11)
    assert one.feasible and one.value is not None and one.metrics is not None
    price = launch(loaded.task.model, loaded.task.hardware).hardware.price_per_hour
    # In steady state the served token rate is the offered one: the rate found times a
    # request's output tokens (every request of the window completes).
    assert one.rate is not None and one.metrics.failed == 0
    expected = price / 3600 / (one.rate * one.metrics.mean_output_tokens) * 1e6
    assert one.value == pytest.approx(expected, rel=1e-6)
    assert not one.higher_is_better
    two = measure_objective(
        loaded.task,
        engine_for(loaded, ServingConfig(tensor_parallel_size=2)),
        spec,
        5,
        11,
    )
    assert two.metrics is not None and two.metrics.price is not None
    assert two.metrics.price.gpus == 2


def test_plain_objectives_share_one_run_and_composites_compare_per_component() -> None:
    loaded = load_task("tiny-composite", TASKS)
    spec, _ = workload_spec(loaded)
    e = engine_for(loaded, ServingConfig(max_num_seqs=8))
    m = measure_objective(loaded.task, e, spec, 5, 11)
    assert m.kind == "composite" and m.value is None and m.runs == 1
    assert [c.kind for c in m.components] == ["output_throughput", "ttft"]
    assert all(c.value is not None and c.value > 0 for c in m.components)
    assert measurement_improvement(loaded.task.objective, m, m) == pytest.approx(1.0)
    assert m.ratio_value() == [c.value for c in m.components]
    wider = measure_objective(loaded.task, engine_for(loaded, ServingConfig()), spec, 5, 11)
    direct = improvement(loaded.task.objective, m.ratio_value(), wider.ratio_value())
    assert measurement_improvement(loaded.task.objective, m, wider) == pytest.approx(direct)


def test_run_workload_counts_integrity() -> None:
    loaded = load_task("tiny-throughput", TASKS)
    spec, _ = workload_spec(loaded)
    wl = materialise(spec, 1)
    ok = run_workload(engine_for(loaded, ServingConfig()), wl, noise_seed=1, sla=None, price=None)
    assert ok.integrity.requests == spec.num_requests and ok.integrity.clean
    # A context shorter than the prompts: the engine refuses every request (HTTP 400).
    short = engine_for(loaded, ServingConfig(max_model_len=64))
    bad = run_workload(short, wl, noise_seed=1, sla=None, price=None)
    assert bad.integrity.failed == spec.num_requests and not bad.integrity.clean


def test_at_rate_sets_poisson_arrivals() -> None:
    loaded = load_task("tiny-throughput", TASKS)
    spec, _ = workload_spec(loaded)
    s = at_rate(spec, 12.5)
    assert s.arrival.kind == "poisson" and s.arrival.rate == 12.5
    assert s.num_requests == spec.num_requests


def test_search_needs_the_run_to_keep_up_and_a_narrow_bracket_finds_the_same_rate() -> None:
    # Attainment alone would pass up to 40; the backlog grows above 10.
    def attainment(rate: float) -> float:
        return 1.0 if rate <= 40.0 else 0.0

    def kept_up(rate: float) -> bool:
        return rate <= 10.0

    kw = {"rate_min": 0.5, "rate_max": 200.0, "target": 0.9, "tolerance": 0.01}
    alone = search_max_rate(attainment, **kw)  # type: ignore[arg-type]
    assert alone.rate is not None and 40.0 / 1.01 <= alone.rate <= 40.0
    both = search_max_rate(attainment, kept_up=kept_up, **kw)  # type: ignore[arg-type]
    assert both.rate is not None and 10.0 / 1.01 <= both.rate <= 10.0
    assert all(p.passed == (p.rate <= 10.0) for p in both.probes)
    assert any(p.kept_up is False and p.attainment == 1.0 for p in both.probes)
    near = search_max_rate(attainment, kept_up=kept_up, start=9.5, bracket_factor=1.05, **kw)  # type: ignore[arg-type]
    assert near.rate is not None and 10.0 / 1.01 <= near.rate <= 10.0
    assert len(near.probes) < len(both.probes)
    with pytest.raises(ValueError):
        search_max_rate(attainment, bracket_factor=1.0, **kw)  # type: ignore[arg-type]
