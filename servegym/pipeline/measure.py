"""A pipeline task's objective, measured on one simulated run.

``pipeline_rate``: answered questions per second over the run (MLPerf's answering rate;
higher is better). ``pipeline_latency``: a question's latency (arrival to answer, seconds)
at the objective's ``statistic`` (lower is better). A run that answered nothing has no
value (infeasible). The measurement carries the run's
:class:`~servegym.pipeline.result.PipelineResult` (``measurement.pipeline``); its integrity
counts are the LLM requests sent and refused.
"""

from __future__ import annotations

import numpy as np

from servegym.pipeline.engine import PipelineEngine
from servegym.pipeline.result import PipelineResult
from servegym.pipeline.sim import simulate_pipeline
from servegym.scoring.objectives import UNITS, IntegrityCounts, ObjectiveMeasurement
from servegym.tasks.spec import ObjectiveSpec, Task
from servegym.workloads.model import Workload


def pipeline_value(objective: ObjectiveSpec, latencies: list[float], rate: float) -> float | None:
    """The objective's value from a run's per-question latencies and answering rate."""
    if not latencies:
        return None
    if objective.kind == "pipeline_rate":
        return rate
    if objective.kind != "pipeline_latency":
        raise ValueError(f"objective '{objective.kind}' is not a pipeline objective")
    if objective.statistic == "mean":
        return float(np.mean(latencies))
    q = {"p50": 50, "p90": 90, "p95": 95, "p99": 99}[objective.statistic]
    return float(np.percentile(latencies, q))


def measure_pipeline(
    task: Task,
    engine: PipelineEngine,
    workload: Workload,
    noise_seed: int,
    *,
    objective: ObjectiveSpec | None = None,
) -> ObjectiveMeasurement:
    """Run ``workload`` through the deployment once and measure the objective (default:
    the task's; a composite measures each component on the same run)."""
    run = simulate_pipeline(engine, workload, noise_seed=noise_seed, task_id=task.id)
    obj = objective if objective is not None else task.objective
    counts = IntegrityCounts(requests=run.requests, failed=run.failed)
    return pipeline_measurement(obj, run.result, counts, sim_seconds=run.sim_seconds)


def pipeline_measurement(
    objective: ObjectiveSpec,
    result: PipelineResult,
    counts: IntegrityCounts,
    *,
    sim_seconds: float = 0.0,
) -> ObjectiveMeasurement:
    """The objective (each component of a composite) on one pipeline run, holding the
    run's result: what the sim and cpu tracks both measure."""
    latencies = [r.latency_s for r in result.tasks]

    def one(o: ObjectiveSpec) -> ObjectiveMeasurement:
        value = pipeline_value(o, latencies, result.answering_tasks_per_s)
        return ObjectiveMeasurement(
            objective=o.label(),
            kind=o.kind,
            unit=UNITS[o.kind],
            higher_is_better=o.higher_is_better,
            value=value,
            feasible=value is not None,
            runs=1,
            sim_seconds=sim_seconds,
            integrity=counts,
        )

    if objective.kind != "composite":
        return one(objective).with_pipeline(result)
    parts = [one(c) for c in objective.components]
    for p in parts:
        p.runs, p.sim_seconds, p.integrity = 0, 0.0, IntegrityCounts()
    return ObjectiveMeasurement(
        objective=objective.label(),
        kind=objective.kind,
        unit=UNITS[objective.kind],
        higher_is_better=objective.higher_is_better,
        value=None,
        feasible=all(p.feasible for p in parts),
        components=parts,
        runs=1,
        sim_seconds=sim_seconds,
        integrity=counts,
    ).with_pipeline(result)
