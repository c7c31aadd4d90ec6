"""Measuring a task's objective on the simulated engine (the sim track's runs).

:func:`measure_objective` runs a launched engine on a workload and returns an
:class:`~servegym.scoring.objectives.ObjectiveMeasurement`: the objective's value in its own
unit, the metrics of the run the value came from, and what it cost (virtual seconds, runs)
and saw (integrity counts). A plain objective is one run of the workload as specified; a
rate objective searches the Poisson arrival rate
(:func:`~servegym.scoring.objectives.search_max_rate`) with one steady run per probe
(:func:`run_steady`: ``rate_requests`` arrivals of the workload's request mix at the rate,
the first ``rate_warmup`` of the arrival span dropped, so a rate passes only when the SLA
holds once queues have had time to build); a composite measures each component, sharing the
plain run. A pipeline deployment is one run of its
pipeline (:func:`servegym.pipeline.measure.measure_pipeline`). What the values mean, and how
two measurements compare, is :mod:`servegym.scoring.objectives`'s (pure functions).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servegym.engines.sim.engine import SimRun, simulate
from servegym.engines.sim.launch import LaunchedEngine
from servegym.loadgen.records import RequestRecord, RunResult
from servegym.pipeline.engine import PipelineEngine
from servegym.pipeline.measure import measure_pipeline
from servegym.scoring.metrics import Metrics, RequestLatencies, compute_metrics, request_latencies
from servegym.scoring.objectives import (
    PLAIN_KINDS,
    RATE_BRACKET_FACTOR,
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
from servegym.scoring.steady import backlog_growth
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
    output_per_session: float | None = None
    """A steady run's forced output tokens per measured session (what a session offers)."""
    kept_up: bool | None = None
    """A steady run's backlog did not grow (:func:`servegym.scoring.steady.backlog_growth`
    within its allowance and :data:`MAX_BACKLOG_GROWTH`)."""


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
    return _measured(engine, workload, run, run.records, run.duration_s, sla, price)


def _measured(
    engine: LaunchedEngine,
    workload: Workload,
    run: SimRun,
    records: list[RequestRecord],
    duration_s: float,
    sla: SLA | None,
    price: Price | None,
    **extra: Any,
) -> SimMeasurement:
    """The measurement of ``records`` of ``run`` (those marked warm-up count nowhere) over
    ``duration_s``; ``extra``: further :class:`SimMeasurement` fields."""
    result = RunResult(
        target=engine.name,
        model=engine.model.id,
        workload=workload.spec.name,
        workload_hash="",
        seed=workload.seed,
        started_at="",
        duration_s=duration_s,
        records=records,
        server_metrics_delta=run.server_metrics_delta,
        stopped_early=run.stopped_early,
    )
    return SimMeasurement(
        metrics=compute_metrics(result, sla=sla, price=price),
        sim_seconds=run.stats.virtual_s,
        integrity=integrity_counts(records),
        latencies=request_latencies(records),
        **extra,
    )


def at_rate(spec: WorkloadSpec, rate: float) -> WorkloadSpec:
    """``spec`` with Poisson arrivals at ``rate`` (as ``--set arrival.kind=poisson
    arrival.rate=R``)."""
    data = spec.model_dump()
    data["arrival"] = ArrivalSpec(kind="poisson", rate=rate).model_dump()
    return WorkloadSpec.model_validate(data)


def steady_spec(spec: WorkloadSpec, rate: float, requests: int) -> WorkloadSpec:
    """``spec`` as one steady stream: ``requests`` Poisson arrivals at ``rate``, no warm-up
    phase (a warm-up phase drains before the measured one starts, which is no steady state)
    and no duration cap."""
    data = at_rate(spec, rate).model_dump()
    data.update(num_requests=requests, warmup_requests=0, duration_s=None)
    return WorkloadSpec.model_validate(data)


MAX_BACKLOG_GROWTH = 0.03
"""The most a steady run's backlog may grow per arrival of its window's second half (a
server serving 97% of its arrivals grows by 0.03) and still count as keeping up."""


def run_steady(
    engine: LaunchedEngine,
    workload: Workload,
    *,
    warmup_share: float,
    noise_seed: int,
    sla: SLA | None,
    price: Price | None,
) -> SimMeasurement:
    """Simulate a steady stream (:func:`steady_spec`) and measure its steady window: every
    request scheduled after the first ``warmup_share`` of the span of first-turn arrivals
    (earlier ones count as warm-up: in no metric, latency or integrity count)."""
    run = simulate(engine, workload, noise=True, noise_seed=noise_seed)
    firsts = [r.scheduled_ns for r in run.records if r.turn_index == 0]
    cut = round(warmup_share * max(firsts, default=0))
    records = [r if r.scheduled_ns >= cut else r.model_copy(update={"warmup": True})
               for r in run.records]  # fmt: skip
    meas = [r for r in records if not r.warmup]
    sent = [r.sent_ns for r in meas if r.sent_ns is not None]
    ends = [e for r in meas if (e := r.done_ns if r.error is None else r.end_ns) is not None]
    duration = max((max(ends) - min(sent)) / 1e9, 0.0) if sent and ends else 0.0
    sessions = len({r.session_id for r in meas})
    tokens = sum(r.expected_output_tokens for r in meas)
    growth, allowance = backlog_growth(run.records, cut)
    return _measured(
        engine, workload, run, records, duration, sla, price,
        output_per_session=tokens / sessions if sessions else None,
        kept_up=growth <= max(MAX_BACKLOG_GROWTH, allowance),
    )  # fmt: skip


def cost_at_rate(price: Price, rate: float, output_per_session: float | None) -> float | None:
    """Dollars per million output tokens when serving ``rate`` arrivals per second in steady
    state: the price per second over the output tokens offered per second (``rate`` times a
    session's output tokens). In steady state the served token rate is the offered one, so
    this is the run's cost without the warm-up and drain around its window; ``None`` when
    the window has no output."""
    if not output_per_session:
        return None
    per_second = price.price_per_hour * price.gpus / 3600.0
    return per_second / (rate * output_per_session) * 1e6


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
        bracket_factor: float,
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
        self.bracket_factor = bracket_factor
        self.price = task_price(task, engine)
        self._plain: SimMeasurement | None = None
        self._searches: dict[tuple[float, float, float, float, int, float], _RateResult] = {}

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

    def _probe_arrivals(self, requests: int) -> int:
        """How many arrivals a probe sends for ``requests`` requests: that many on a
        single-turn workload; on an agentic one, sessions enough for about that many turns
        (its arrivals are sessions), at least 10."""
        if self.spec.kind != "agentic":
            return requests
        wl = self.workload or materialise(self.spec, self.seed, base_dir=self.base_dir)
        measured = wl.sessions[wl.warmup_sessions :]
        turns = sum(len(s.turns) for s in measured) / max(len(measured), 1)
        return max(10, round(requests / max(turns, 1.0)))

    def rate_search(self, objective: ObjectiveSpec) -> tuple[_RateResult, bool]:
        key = (
            objective.rate_min,
            objective.rate_max,
            objective.attainment_target,
            objective.rate_tolerance,
            objective.rate_requests,
            objective.rate_warmup,
        )
        if key in self._searches:
            return self._searches[key], False
        runs: dict[float, SimMeasurement] = {}
        arrivals = self._probe_arrivals(objective.rate_requests)

        def attainment_at(rate: float) -> float:
            probe = steady_spec(self.spec, rate, arrivals)
            wl = materialise(probe, self.seed, base_dir=self.base_dir)
            m = run_steady(
                self.engine,
                wl,
                warmup_share=objective.rate_warmup,
                noise_seed=self.noise_seed,
                sla=self.task.sla,
                price=self.price,
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
            bracket_factor=self.bracket_factor,
            kept_up=lambda rate: runs[rate].kept_up is not False,
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
                per_session = rs.shown.output_per_session
                value = cost_at_rate(self.price, rs.rate, per_session) if rs.rate else None
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
    bracket_factor: float = RATE_BRACKET_FACTOR,
) -> ObjectiveMeasurement:
    """Measure ``objective`` (default: the task's) for ``engine`` on ``spec`` at ``seed``.

    Every simulation runs with noise seeded by ``noise_seed`` (the same for every probe of
    a rate search: common random numbers make the attainment curve smooth in the rate).
    ``workload`` is ``spec`` materialised at ``seed``, when the caller has it already.
    ``rate_hint`` is where a rate search starts (e.g. the baseline's rate; default the
    geometric middle of the objective's range), bracketing by ``bracket_factor``.
    ``sim_seconds_cap`` stops a rate search (between probes) once the measurement has
    simulated that many virtual seconds; it then reports the best rate bracketed so far
    (``search_truncated``).
    """
    if isinstance(engine, PipelineEngine):
        wl = workload or materialise(spec, seed, base_dir=base_dir)
        return measure_pipeline(task, engine, wl, noise_seed, objective=objective)
    measurer = _Measurer(
        task,
        engine,
        spec,
        seed,
        noise_seed,
        base_dir,
        workload,
        rate_hint,
        sim_seconds_cap,
        bracket_factor,
    )
    return measurer.measure(objective if objective is not None else task.objective)
