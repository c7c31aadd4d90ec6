"""Measuring a task's objective on the simulated engine (the sim track's runs).

:func:`measure_objective` runs a launched engine on a workload and returns an
:class:`~servegym.scoring.objectives.ObjectiveMeasurement`: the objective's value in its own
unit, the metrics of the run the value came from, and what it cost (virtual seconds, runs)
and saw (integrity counts). A plain objective is one run of the workload as specified; a
rate objective searches the Poisson arrival rate
(:func:`~servegym.scoring.objectives.search_max_rate`) with one run per probe; a composite
measures each component, sharing the plain run. A pipeline deployment is one run of its
pipeline (:func:`servegym.pipeline.measure.measure_pipeline`). What the values mean, and how
two measurements compare, is :mod:`servegym.scoring.objectives`'s (pure functions).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servegym.engines.sim.engine import simulate
from servegym.engines.sim.launch import LaunchedEngine
from servegym.loadgen.records import RunResult
from servegym.pipeline.engine import PipelineEngine
from servegym.pipeline.measure import measure_pipeline
from servegym.scoring.metrics import Metrics, RequestLatencies, compute_metrics, request_latencies
from servegym.scoring.objectives import (
    PLAIN_KINDS,
    RATE_KIND_SET,
    UNITS,
    IntegrityCounts,
    ObjectiveMeasurement,
    RateProbe,
    integrity_counts,
    plain_value,
    search_max_rate,
    sum_integrity,
)
from servegym.scoring.sla import SLA, Price
from servegym.tasks.spec import ObjectiveSpec, Task
from servegym.workloads.generate import materialise
from servegym.workloads.model import Workload
from servegym.workloads.spec import ArrivalSpec, WorkloadSpec

SimEngine = LaunchedEngine | PipelineEngine
"""What a config starts as on the simulator: one engine, or a pipeline deployment."""


@dataclass(frozen=True, slots=True)
class SimMeasurement:
    """One simulated run, measured."""

    metrics: Metrics
    sim_seconds: float
    integrity: IntegrityCounts
    latencies: RequestLatencies


def task_price(task: Task, engine: SimEngine) -> Price:
    """What the engine costs: the task's price per GPU-hour (default: the hardware
    profile's) for every GPU it occupies."""
    per_gpu = (
        task.price_per_hour if task.price_per_hour is not None else engine.hardware.price_per_hour
    )
    return Price(price_per_hour=per_gpu, gpus=engine.num_gpus)


def run_workload(
    engine: LaunchedEngine,
    workload: Workload,
    *,
    noise_seed: int,
    sla: SLA | None,
    price: Price | None,
) -> SimMeasurement:
    """Simulate ``workload`` (noise on, ``noise_seed``) and compute its metrics."""
    run = simulate(engine, workload, noise=True, noise_seed=noise_seed)
    result = RunResult(
        target=engine.name,
        model=engine.model.id,
        workload=workload.spec.name,
        workload_hash="",
        seed=workload.seed,
        started_at="",
        duration_s=run.duration_s,
        records=run.records,
        server_metrics_delta=run.server_metrics_delta,
        stopped_early=run.stopped_early,
    )
    metrics = compute_metrics(result, sla=sla, price=price)
    counts = integrity_counts(run.records)
    return SimMeasurement(
        metrics=metrics,
        sim_seconds=run.stats.virtual_s,
        integrity=counts,
        latencies=request_latencies(run.records),
    )


def at_rate(spec: WorkloadSpec, rate: float) -> WorkloadSpec:
    """``spec`` with Poisson arrivals at ``rate`` (as ``--set arrival.kind=poisson
    arrival.rate=R``)."""
    data = spec.model_dump()
    data["arrival"] = ArrivalSpec(kind="poisson", rate=rate).model_dump()
    return WorkloadSpec.model_validate(data)


class _Measurer:
    """Measures the objectives of one (engine, workload) pair, sharing the plain run."""

    def __init__(
        self,
        task: Task,
        engine: LaunchedEngine,
        spec: WorkloadSpec,
        seed: int,
        noise_seed: int,
        base_dir: Path | None,
        workload: Workload | None,
        rate_hint: float | None,
        sim_seconds_cap: float | None,
    ) -> None:
        self.task = task
        self.sim_seconds_cap = sim_seconds_cap
        self.spent = 0.0
        self.engine = engine
        self.spec = spec
        self.seed = seed
        self.noise_seed = noise_seed
        self.base_dir = base_dir
        self.workload = workload
        self.rate_hint = rate_hint
        self.price = task_price(task, engine)
        self._plain: SimMeasurement | None = None
        self._searches: dict[tuple[float, float, float, float], _RateResult] = {}

    def plain(self) -> tuple[SimMeasurement, bool]:
        """The workload as specified, run once; True when this call ran it."""
        if self._plain is not None:
            return self._plain, False
        wl = self.workload or materialise(self.spec, self.seed, base_dir=self.base_dir)
        self._plain = run_workload(
            self.engine, wl, noise_seed=self.noise_seed, sla=self.task.sla, price=self.price
        )
        self.spent += self._plain.sim_seconds
        return self._plain, True

    def rate_search(self, objective: ObjectiveSpec) -> tuple[_RateResult, bool]:
        key = (
            objective.rate_min,
            objective.rate_max,
            objective.attainment_target,
            objective.rate_tolerance,
        )
        if key in self._searches:
            return self._searches[key], False
        runs: dict[float, SimMeasurement] = {}

        def attainment_at(rate: float) -> float:
            wl = materialise(at_rate(self.spec, rate), self.seed, base_dir=self.base_dir)
            m = run_workload(
                self.engine, wl, noise_seed=self.noise_seed, sla=self.task.sla, price=self.price
            )
            runs[rate] = m
            self.spent += m.sim_seconds
            return m.metrics.sla_attainment or 0.0

        def out_of_budget() -> bool:
            return self.sim_seconds_cap is not None and self.spent >= self.sim_seconds_cap

        found = search_max_rate(
            attainment_at,
            rate_min=objective.rate_min,
            rate_max=objective.rate_max,
            target=objective.attainment_target,
            tolerance=objective.rate_tolerance,
            start=self.rate_hint,
            should_stop=out_of_budget,
        )
        shown_rate = found.rate if found.rate is not None else objective.rate_min
        if shown_rate not in runs:  # rate_min was never probed (cannot happen: it failed)
            attainment_at(shown_rate)
        total = IntegrityCounts()
        for m in runs.values():
            total = total.add(m.integrity)
        result = _RateResult(
            truncated=found.truncated,
            rate=found.rate,
            shown_rate=shown_rate,
            shown=runs[shown_rate],
            probes=found.probes,
            runs=len(runs),
            sim_seconds=sum(m.sim_seconds for m in runs.values()),
            integrity=total,
        )
        self._searches[key] = result
        return result, True

    def measure(self, objective: ObjectiveSpec) -> ObjectiveMeasurement:
        label, kind = objective.label(), objective.kind
        unit, hib = UNITS[kind], objective.higher_is_better
        if kind == "composite":
            parts = [self.measure(c) for c in objective.components]
            shown = next((p for p in parts if p.kind in PLAIN_KINDS), parts[0])
            return ObjectiveMeasurement(
                objective=label,
                kind=kind,
                unit=unit,
                higher_is_better=hib,
                value=None,
                feasible=all(p.feasible for p in parts),
                components=parts,
                search_truncated=any(p.search_truncated for p in parts),
                metrics=shown.metrics,
                runs=sum(p.runs for p in parts),
                sim_seconds=sum(p.sim_seconds for p in parts),
                integrity=sum_integrity(parts),
            ).with_latencies(shown.latencies)
        if kind in RATE_KIND_SET:
            rs, ran = self.rate_search(objective)
            value: float | None
            if kind == "max_rate_at_sla":
                value = rs.rate if rs.rate is not None else 0.0
            else:
                value = rs.shown.metrics.cost_per_mtok if rs.rate is not None else None
            return ObjectiveMeasurement(
                objective=label,
                kind=kind,
                unit=unit,
                higher_is_better=hib,
                value=value,
                feasible=rs.rate is not None,
                rate=rs.shown_rate,
                rate_probes=rs.probes,
                search_truncated=rs.truncated,
                metrics=rs.shown.metrics,
                runs=rs.runs if ran else 0,
                sim_seconds=rs.sim_seconds if ran else 0.0,
                integrity=rs.integrity if ran else IntegrityCounts(),
            ).with_latencies(rs.shown.latencies)
        m, ran = self.plain()
        value = plain_value(objective, m.metrics)
        return ObjectiveMeasurement(
            objective=label,
            kind=kind,
            unit=unit,
            higher_is_better=hib,
            value=value,
            feasible=value is not None,
            metrics=m.metrics,
            runs=1 if ran else 0,
            sim_seconds=m.sim_seconds if ran else 0.0,
            integrity=m.integrity if ran else IntegrityCounts(),
        ).with_latencies(m.latencies)


@dataclass(frozen=True, slots=True)
class _RateResult:
    truncated: bool
    rate: float | None
    shown_rate: float
    shown: SimMeasurement
    probes: list[RateProbe]
    runs: int
    sim_seconds: float
    integrity: IntegrityCounts


def measure_objective(
    task: Task,
    engine: SimEngine,
    spec: WorkloadSpec,
    seed: int,
    noise_seed: int,
    *,
    base_dir: Path | None = None,
    workload: Workload | None = None,
    rate_hint: float | None = None,
    objective: ObjectiveSpec | None = None,
    sim_seconds_cap: float | None = None,
) -> ObjectiveMeasurement:
    """Measure ``objective`` (default: the task's) for ``engine`` on ``spec`` at ``seed``.

    Every simulation runs with noise seeded by ``noise_seed`` (the same for every probe of
    a rate search: common random numbers make the attainment curve smooth in the rate).
    ``workload`` is ``spec`` materialised at ``seed``, when the caller has it already.
    ``rate_hint`` is where a rate search starts (e.g. the baseline's rate; default the
    geometric middle of the objective's range). ``sim_seconds_cap`` stops a rate search
    (between probes) once the measurement has simulated that many virtual seconds; it
    then reports the best rate bracketed so far (``search_truncated``).
    """
    if isinstance(engine, PipelineEngine):
        wl = workload or materialise(spec, seed, base_dir=base_dir)
        return measure_pipeline(task, engine, wl, noise_seed, objective=objective)
    measurer = _Measurer(
        task, engine, spec, seed, noise_seed, base_dir, workload, rate_hint, sim_seconds_cap
    )
    return measurer.measure(objective if objective is not None else task.objective)
