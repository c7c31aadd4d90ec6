"""Measuring a task's objective on a real server (the cpu and gpu tracks).

A real run is one workload against one launched server; its objective is read from the
run's metrics (:func:`~servegym.scoring.objectives.plain_value`), a composite from the same
run's metrics for each component. Objectives that search the arrival rate
(``max_rate_at_sla``, ``cost_at_sla``) take tens of runs and belong to the simulator; a
real-track task cannot use them (:func:`real_objective_problem`).
"""

from __future__ import annotations

from servegym.loadgen.records import RunResult
from servegym.scoring.metrics import Metrics, compute_metrics, request_latencies
from servegym.scoring.objectives import (
    UNITS,
    ObjectiveMeasurement,
    integrity_counts,
    plain_value,
)
from servegym.scoring.sla import Price
from servegym.tasks.spec import RATE_KINDS, ObjectiveSpec, Task


def real_objective_problem(objective: ObjectiveSpec) -> str | None:
    """Why a real-track task cannot score ``objective``, or ``None`` when it can."""
    kinds = [c.kind for c in objective.components] if objective.components else [objective.kind]
    rate = [k for k in kinds if k in RATE_KINDS]
    if rate:
        return (
            f"objective '{rate[0]}' searches the arrival rate over tens of runs; real tracks "
            "score one-run objectives (throughput, latency, goodput at a fixed rate)"
        )
    return None


def real_price(task: Task) -> Price | None:
    """The task's price for one server (real tracks state it in the task)."""
    if task.price_per_hour is None:
        return None
    return Price(price_per_hour=task.price_per_hour, gpus=1)


def _measurement(objective: ObjectiveSpec, metrics: Metrics) -> ObjectiveMeasurement:
    if objective.kind == "composite":
        parts = [_measurement(c, metrics) for c in objective.components]
        return ObjectiveMeasurement(
            objective=objective.label(),
            kind="composite",
            unit=UNITS["composite"],
            higher_is_better=True,
            value=None,
            feasible=all(p.feasible for p in parts),
            components=parts,
            metrics=metrics,
            runs=1,
        )
    value = plain_value(objective, metrics)
    return ObjectiveMeasurement(
        objective=objective.label(),
        kind=objective.kind,
        unit=UNITS[objective.kind],
        higher_is_better=objective.higher_is_better,
        value=value,
        feasible=value is not None,
        metrics=metrics,
        runs=1,
    )


def measure_run(task: Task, result: RunResult) -> ObjectiveMeasurement:
    """The task's objective from one real run, with the run's metrics and integrity."""
    metrics = compute_metrics(result, sla=task.sla, price=real_price(task))
    m = _measurement(task.objective, metrics)
    m.integrity = integrity_counts(result.records)
    return m.with_latencies(request_latencies(result.records))
