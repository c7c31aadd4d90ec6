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
    result = run.result
    latencies = [r.latency_s for r in result.tasks]
    counts = IntegrityCounts(requests=run.requests, failed=run.failed)

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
            sim_seconds=run.sim_seconds,
            integrity=counts,
        )

    if obj.kind == "composite":
        parts = [one(c) for c in obj.components]
        for p in parts:
            p.runs, p.sim_seconds, p.integrity = 0, 0.0, IntegrityCounts()
        m = ObjectiveMeasurement(
            objective=obj.label(),
            kind=obj.kind,
            unit=UNITS[obj.kind],
            higher_is_better=obj.higher_is_better,
            value=None,
            feasible=all(p.feasible for p in parts),
            components=parts,
            runs=1,
            sim_seconds=run.sim_seconds,
            integrity=counts,
        )
    else:
        m = one(obj)
    return m.with_pipeline(result)
